"""The `cosyserve` command line. Errors end with one line on stderr that says what to do, and the exit
status of `exit_codes.ExitCode` (usage 2, failed work 1, something missing 3)."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from cosyserve.commands.parsing import CliParser
from cosyserve.errors import EXTRA_OF_MODULE, CosyServeError, InputError, MissingExtra, exit_code_for
from cosyserve.exit_codes import ExitCode, epilog


def _cmd_parity(args: argparse.Namespace) -> int:
    from cosyserve.parity.runner import run_parity

    fixture_dir = Path(args.dir)
    if not fixture_dir.is_dir():
        raise InputError(
            f"{fixture_dir} is not a directory: pass a parity fixture directory holding model/ and golden "
            "files (e.g. ../shared/parity/tiny)"
        )
    all_passed = True
    for line in run_parity(fixture_dir):
        print(line.render(), flush=True)
        all_passed &= line.passed
    print("parity: all checks pass" if all_passed else "parity: FAILED (see the lines marked FAIL)")
    return ExitCode.OK if all_passed else ExitCode.FAILED


def _cmd_download(args: argparse.Namespace) -> int:
    from cosyserve.modeldir.download import download_model

    if args.asr:
        from cosyserve.modeldir.asr_download import download_asr

        print(download_asr(source=args.source, target_dir=Path(args.dir) if args.dir else None))
        return 0
    path = download_model(args.model, source=args.source, target_dir=Path(args.dir) if args.dir else None)
    print(path)
    return 0


def _cmd_demo_model(args: argparse.Namespace) -> int:
    from cosyserve.modeldir.demo_model import write_demo_model

    path = write_demo_model(
        Path(args.dir),
        seed=args.seed,
        overwrite=args.force,
        progress=lambda line: print(line, file=sys.stderr),
        size=args.size,
    )
    print(path)  # the summary went to stderr with the progress; stdout is the path, as `download` prints
    return 0


class VersionAction(argparse.Action):
    """`--version`: the release and the source digest (`build_info`), computed only when asked."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        from cosyserve.build_info import version_line

        print(version_line())  # on stdout, as argparse's own version action prints
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog="cosyserve",
        description="CosyVoice3 voice-cloning TTS engine and service",
        epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=VersionAction, nargs=0, help="show the version and which source")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    parity = sub.add_parser(
        "parity", help="compare the engine with the official outputs in a fixture directory"
    )
    parity.add_argument(
        "dir", help="fixture directory: model/ plus golden files (e.g. ../shared/parity/tiny)"
    )
    parity.set_defaults(func=_cmd_parity)

    download = sub.add_parser("download", help="download an official model directory")
    download.add_argument(
        "model", nargs="?", default=None, help="model id (default: Fun-CosyVoice3-0.5B-2512)"
    )
    download.add_argument("--source", choices=("modelscope", "huggingface"), default=None)
    download.add_argument("--dir", default=None, help="target directory (default: the cosyserve model cache)")
    download.add_argument(
        "--asr",
        action="store_true",
        help="download the prompt-transcription model (SenseVoice-Small for sherpa-onnx) instead",
    )
    download.set_defaults(func=_cmd_download)

    demo = sub.add_parser(
        "demo-model", help="write a small random-weight model directory (noise) for offline tries"
    )
    demo.add_argument("dir", help="directory to write")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--force", action="store_true", help="overwrite an existing directory")
    demo.add_argument(
        "--size",
        choices=("demo", "full"),
        default="demo",
        help="demo: small networks, ~50 MB (default); full: the real architecture's sizes with random "
        "weights, 3.7 GB, for timing start-up and memory without a download",
    )
    demo.set_defaults(func=_cmd_demo_model)

    from cosyserve.commands import synthesize

    synthesize.add_parsers(sub)
    from cosyserve.commands import batch

    batch.add_parsers(sub)

    from cosyserve.bench.cli import add_bench_parser

    add_bench_parser(sub)
    from cosyserve.commands import serve

    serve.add_parsers(sub)
    from cosyserve.commands import worker

    worker.add_parser(sub)
    from cosyserve.commands import normalize

    normalize.add_parser(sub)
    from cosyserve.commands import verify

    verify.add_parser(sub)
    from cosyserve.commands import backup

    backup.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    if args.command in DATA_DIR_WRITERS:  # (serve, worker and backup see to it themselves)
        from cosyserve.commands.private_files import keep_files_private

        keep_files_private()
    try:
        status = int(func(args))
        sys.stdout.flush()  # a reader that went away is found here, not in the exit's own flush
        return status
    except CosyServeError as exc:
        return report_error(args.command, exc)
    except ModuleNotFoundError as exc:  # an optional extra that the command reached for
        top = (exc.name or "").split(".")[0]
        if top not in EXTRA_OF_MODULE:
            raise
        missing = MissingExtra(top, EXTRA_OF_MODULE[top], f"cosyserve {args.command}")
        return report_error(args.command, missing)
    except BrokenPipeError:  # `cosyserve verify *.wav | head -1`: stop quietly, as SIGPIPE would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (the exit's flush fails too)
        return ExitCode.OUTPUT_CLOSED
    except OSError as exc:  # a path the user gave: missing, not writable, a full disk
        if exc.filename is None and exc.errno not in DISK_ERRORS:
            raise
        where = f"{exc.filename}" + (f" -> {exc.filename2}" if exc.filename2 else "") if exc.filename else ""
        problem = f"{where}: " if where else ""
        problem += f"{exc.strerror or exc}; check the path, its permissions and the free space"
        say(f"cosyserve {args.command}: error: {problem}")
        return ExitCode.FAILED
    except Exception as exc:
        if not type(exc).__module__.startswith("sqlalchemy"):
            raise
        # the database could not be opened or written (a read-only folder, a server that is down, a
        # dialect whose driver is missing): one line, not the driver's traceback
        cause = getattr(exc, "orig", None) or exc
        said = " ".join(str(cause).split())[:300]
        say(
            f"cosyserve {args.command}: error: the database could not be used ({said}): check --data-dir "
            "or --database-url, that its folder is writable and its server is running"
        )
        return ExitCode.UNAVAILABLE
    except KeyboardInterrupt:
        say(f"cosyserve {args.command}: interrupted")
        return ExitCode.INTERRUPTED


# errors a full, read-only or failing disk gives without naming a file
DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})
# commands that write the data directory: its recordings, keys and database are the user's alone
DATA_DIR_WRITERS = frozenset({"voices", "keys"})


def report_error(command: str, exc: BaseException) -> int:
    """`cosyserve COMMAND: error: …` in one line on stderr; returns the exit status for `exc`."""
    one_line = "; ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    say(f"cosyserve {command}: error: {one_line}")
    return int(exit_code_for(exc))


def say(line: str) -> None:
    """`line` on stderr, on a line of its own: a progress bar still drawn is ended first (the message
    was printed at the end of the bar's line)."""
    std = sys.modules.get("tqdm.std")  # loaded only by a command that drew a bar
    if std is not None:
        for bar in list(getattr(std.tqdm, "_instances", ())):
            bar.close()
    print(line, file=sys.stderr)


def serve_main(argv: Sequence[str] | None = None) -> int:
    """`python app.py …` and `./run.sh …`: the same as `cosyserve serve …`."""
    return main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
