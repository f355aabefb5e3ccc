"""`cosyserve synthesize` and `cosyserve voices`: the Synthesizer from the command line."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import soundfile as sf

from cosyserve.commands.data_dirs import default_data_dir, existing_data_dir
from cosyserve.commands.output_paths import check_writable
from cosyserve.commands.text_files import read_text_file
from cosyserve.errors import InputError
from cosyserve.limits import DEFAULT_MAX_TEXT_CHARS, SPEED_RANGE_TEXT
from cosyserve.service.quality.overrides import THRESHOLD_NAMES, check_overrides
from cosyserve.service.setting_groups import DEFAULT_CONSENT_STATEMENT

if TYPE_CHECKING:
    from cosyserve.service.outcomes import SynthesisResult

STATEMENT_ENV = "COSYSERVE_VOICE_CONSENT_STATEMENT"


def add_text_limit_argument(parser: argparse.ArgumentParser) -> None:
    """--max-chars: the longest text one synthesis carries (as the server's `max_text_chars`). Its default
    comes from the environment as text, so a bad value there is this option's usage error (parsed when the
    command runs), not a traceback while the parser is built."""
    parser.add_argument(
        "--max-chars",
        type=_text_limit,
        default=os.environ.get("COSYSERVE_MAX_TEXT_CHARS", str(DEFAULT_MAX_TEXT_CHARS)),
        help="the longest text one synthesis takes, in characters [env COSYSERVE_MAX_TEXT_CHARS] "
        f"(default: {DEFAULT_MAX_TEXT_CHARS})",
    )


def _text_limit(value: str) -> int:
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise argparse.ArgumentTypeError(
            f"{value!r} is no text limit: give a whole number of characters, at least 1 (--max-chars, or "
            "the environment's COSYSERVE_MAX_TEXT_CHARS)"
        )
    return limit


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=os.environ.get("COSYSERVE_MODEL"),
        help="model directory, model id (downloaded if missing) or 'demo' (random weights: noise)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument(
        "--precision",
        choices=("auto", "float32", "float16", "bfloat16"),
        default=os.environ.get("COSYSERVE_PRECISION", "auto"),
        help="compute dtype: auto (float16 on a GPU, float32 on the CPU), float32 (the exact path), "
        "float16, bfloat16 (GPU only); the vocoder always runs in float32",
    )
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: all available)")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where voices live (default: $COSYSERVE_DATA_DIR or ~/.local/share/cosyserve)",
    )


def open_voice_library(data_dir: Path | None, model_fingerprint: str, create: bool = True):
    """The CLI's voice library; `create=False` for a command that only reads or changes it."""
    import sqlalchemy as sa

    from cosyserve.service.stores.voices import VoiceLibrary

    root = data_dir or default_data_dir()
    if not create:
        root = existing_data_dir(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(f"sqlite:///{root / 'cosyserve.db'}")
    return VoiceLibrary(root / "voices", engine, sa.MetaData(), model_checksum=model_fingerprint)


def load_synthesizer(args: argparse.Namespace):
    from cosyserve.modeldir.resolve import resolve_model

    model_dir = resolve_model(args.model)  # before the engine's imports (seconds): a missing model fails fast
    from cosyserve.service.local.synthesizer import Synthesizer

    # a saved voice is read from the data directory named: a misspelt one is said, not created
    reads_voice = bool(getattr(args, "voice", None) and getattr(args, "data_dir", None))
    voices = open_voice_library(args.data_dir, model_dir.fingerprint, create=not reads_voice)
    synthesizer = Synthesizer.load(
        model_dir,
        device=args.device,
        precision=args.precision,
        threads=args.threads,
        voices=voices,
        max_text_chars=args.max_chars if hasattr(args, "max_chars") else DEFAULT_MAX_TEXT_CHARS,
        engine_options=engine_options(args),
    )
    if (model_dir.path / "cosyserve_demo.json").is_file():
        print("note: the demo model has random weights; its audio is noise", file=sys.stderr)
    if not getattr(args, "quiet", False):
        print(f"engine: {describe_engine(synthesizer.engine.describe())}", file=sys.stderr)
    return synthesizer


def engine_options(args: argparse.Namespace):
    """How the engine runs one request from the command line: CUDA graphs for the LM step on a GPU
    (unless --no-cuda-graph), and the flow options (which change the audio: `cosyserve bench`)."""
    import dataclasses

    from cosyserve.engine.device import resolve_device
    from cosyserve.engine.flow_options import check_flow_options
    from cosyserve.engine.pipeline import EngineOptions

    flow_steps, no_cfg = getattr(args, "flow_steps", 10), getattr(args, "no_cfg", False)
    check_flow_options(flow_steps, no_cfg)
    options = EngineOptions.for_device(resolve_device(args.device).type, 1)
    if getattr(args, "no_cuda_graph", False):
        options = dataclasses.replace(options, cuda_graph=False)
    return dataclasses.replace(options, flow_steps=flow_steps, guidance=not no_cfg)


def describe_engine(described: dict) -> str:
    """One line from `SpeechEngine.describe()`: device, precision and where it applies."""
    dtypes = described["dtypes"]
    paths = [name for name in ("cuda_graph", "batch_decode", "batch_flow") if described[name]]
    flow = f"{described['flow_steps']} flow steps" + ("" if described["guidance"] else ", no CFG")
    return (
        f"{described['device']} {described['precision']} (LM {dtypes['lm_weights']}, flow DiT "
        f"{dtypes['flow_dit_products']} computing in {dtypes['flow_compute']}, vocoder {dtypes['vocoder']}); "
        f"{flow}" + (f"; {', '.join(paths)}" if paths else "")
    )


def _read_text(args: argparse.Namespace) -> str:
    if (args.text is None) == (args.text_file is None):
        raise InputError("give exactly one of --text or --text-file")
    if args.text_file is not None:
        return read_text_file(args.text_file)
    return args.text


def add_threshold_arguments(parser: argparse.ArgumentParser, whose: str) -> None:
    """`--quality-min-similarity N` …: the names `serve` gives the server's thresholds, here for one run."""
    for name in THRESHOLD_NAMES:
        parser.add_argument(
            f"--quality-{name.replace('_', '-')}",
            type=float,
            default=None,
            metavar="N",
            help=f"{whose} {name} threshold (default: the server settings'; docs/quality.md)",
        )


def threshold_arguments(args: argparse.Namespace) -> dict[str, float]:
    """The thresholds given by `add_threshold_arguments`' options, checked (empty: none given)."""
    given = {
        name: value for name in THRESHOLD_NAMES if (value := getattr(args, f"quality_{name}")) is not None
    }
    return check_overrides(given)


def cmd_synthesize(args: argparse.Namespace) -> int:
    text = _read_text(args)
    if (args.voice is None) == (args.prompt_wav is None):
        raise InputError("give exactly one of --voice NAME or --prompt-wav FILE")
    prompt_wav = None
    if args.prompt_wav is not None:
        try:
            prompt_wav = Path(args.prompt_wav).read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read --prompt-wav {args.prompt_wav}: {exc.strerror}") from exc
    thresholds = threshold_arguments(args)
    out = Path(args.out)
    if out.suffix.lower() not in (".wav", ".flac", ".ogg"):
        raise InputError("--out must end in .wav, .flac or .ogg")
    check_writable([out, *(Path(path) for path in (args.srt, args.vtt) if path)])  # before any work
    synthesizer = load_synthesizer(args)
    from tqdm import tqdm

    from cosyserve.commands.cli_labels import cli_labeller, label_written_file
    from cosyserve.service.requests import SynthesisRequest
    from cosyserve.service.subtitles import to_srt, to_vtt

    request = SynthesisRequest(
        text=text,
        voice=args.voice,
        prompt_wav=prompt_wav,
        prompt_text=args.prompt_text,
        instruct=args.instruct,
        seed=args.seed,
        speed=args.speed,
        volume=args.volume,
        stream=args.stream,
        takes=args.takes,
        thresholds=thresholds or None,
    )
    bar = tqdm(total=1, unit="sentence", desc="synthesizing", file=sys.stderr, disable=args.quiet)

    def progress(p) -> None:
        bar.total = p.segments_total
        bar.n = p.segments_done
        bar.refresh()

    labels = cli_labeller(args.data_dir or default_data_dir())
    explicit = labels.explicit_for(synthesizer, request, {})
    stream = synthesizer.synthesize(request, progress=progress)
    try:
        with sf.SoundFile(out, "w", samplerate=synthesizer.sample_rate, channels=1) as sink:
            if explicit is not None:
                sink.write(explicit.start)
            for chunk in stream:  # written as it arrives: with --stream, the file grows chunk by chunk
                sink.write(chunk.samples)
            if explicit is not None and explicit.end is not None:
                sink.write(explicit.end)
    except sf.LibsndfileError as exc:  # the disk filled up, the folder went away
        raise InputError(f"could not write {out} ({exc}): check the path and the free space") from exc
    result = labels.with_explicit(stream.result(), explicit)  # its timings shifted past the cue
    label_written_file(labels, out, args.voice)
    bar.close()
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.srt:
        Path(args.srt).write_text(to_srt(result.timings), encoding="utf-8")
    if args.vtt:
        Path(args.vtt).write_text(to_vtt(result.timings), encoding="utf-8")
    _say_what_was_written(out, result, as_json=args.json)
    return 0


def _say_what_was_written(out: Path, result: SynthesisResult, *, as_json: bool) -> None:
    """One line on stdout: the file, its length, seed and real-time factor, and the kept take's scores
    (`--json`: one JSON object with every score)."""
    rtf = result.stage_seconds.get("total", 0.0) / max(result.duration_s, 1e-9)
    quality = result.quality
    if as_json:
        summary = {
            "out": str(out),
            "duration_s": round(result.duration_s, 3),
            "seed": result.seed,
            "speech_tokens": result.speech_tokens,
            "real_time_factor": round(rtf, 3),
            "quality": quality.as_dict() if quality is not None else None,
        }
        print(json.dumps(summary, ensure_ascii=False))
        return
    checked = ""
    if quality is not None:
        verdict = "passed" if quality.scores.passed else "failed " + ", ".join(quality.scores.failed)
        checked = f", {quality.takes} take{'s' if quality.takes > 1 else ''}: {verdict}"
    print(
        f"wrote {out} ({result.duration_s:.2f} s, {result.speech_tokens} speech tokens, seed {result.seed}, "
        f"real-time factor {rtf:.2f}{checked})"
    )


def cmd_voices(args: argparse.Namespace) -> int:
    if args.voices_command == "add":
        synthesizer = load_synthesizer(args)
        try:
            audio = Path(args.wav).read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read {args.wav}: {exc.strerror}") from exc
        consent = None
        if args.consent:  # the operator on the server confirms the statement, as an admin would
            statement = os.environ.get(STATEMENT_ENV) or DEFAULT_CONSENT_STATEMENT  # the server's wording
            consent = {"statement": statement, "by": f"cli:{getpass.getuser()}", "at": round(time.time(), 3)}
        voice = synthesizer.add_voice(
            args.name, audio, args.transcript, audio_suffix=Path(args.wav).suffix.lower(), consent=consent
        )
        print(f"added voice {voice.name} ({voice.id})")
        if consent is None:
            print(
                "note: no consent recorded; with --consent you confirm that the person whose voice this is "
                "agreed to its cloning (shown to admins with the voice)",
                file=sys.stderr,
            )
        for warning in voice.report.get("warnings", []):
            print(f"warning: {warning}", file=sys.stderr)
        return 0
    library = open_voice_library(args.data_dir, model_fingerprint="", create=False)
    if args.voices_command == "list":
        voices = library.list()
        if not voices:
            print("no voices yet: add one with `cosyserve voices add NAME --wav FILE --transcript TEXT`")
        for voice in voices:
            duration = voice.report.get("duration_s")
            length = f"{duration:.1f} s" if isinstance(duration, int | float) else "?"
            consent = f"consent by {voice.consent.get('by')}" if voice.consent else "no consent recorded"
            owner = voice.owner or "-"
            print(
                f"{voice.id}  {voice.name:<24} {length:>7}  {owner:<12} {consent}  "
                f"{voice.transcript or '(no transcript)'}"
            )
    elif args.voices_command == "rm":
        library.delete(args.name)
        print(f"deleted voice {args.name}")
    elif args.voices_command == "rename":
        voice = library.update(args.name, name=args.new_name)
        print(f"renamed to {voice.name}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    synth = sub.add_parser("synthesize", help="speak a text in a cloned voice and write an audio file")
    synth.add_argument("--text", help="what to say (or --text-file)")
    synth.add_argument("--text-file", help="read what to say from this UTF-8 file")
    synth.add_argument("--prompt-wav", help="a 3-30 s recording of the voice to clone")
    synth.add_argument("--prompt-text", help="its transcript (zero-shot clone); omit for cross-lingual")
    synth.add_argument("--voice", help="a saved voice (see `cosyserve voices`)")
    synth.add_argument("--instruct", help="an instruction, e.g. 请用四川话表达 or 'speak happily'")
    synth.add_argument("--seed", type=int, default=None, help="make the output reproducible")
    synth.add_argument("--speed", type=float, default=None, help=f"{SPEED_RANGE_TEXT} (default 1.0)")
    synth.add_argument("--volume", type=float, default=1.0, help="loudness, 0 to 4 (default: 1, unchanged)")
    synth.add_argument("--stream", action="store_true", help="generate and write in chunks as tokens arrive")
    synth.add_argument(
        "--flow-steps",
        type=int,
        default=10,
        help="flow solver steps (default 10, the exact path); fewer is faster but changes the audio",
    )
    synth.add_argument(
        "--no-cfg",
        action="store_true",
        help="flow without classifier-free guidance: faster, changes the audio",
    )
    synth.add_argument("--no-cuda-graph", action="store_true", help="on a GPU: decode without CUDA graphs")
    add_text_limit_argument(synth)
    synth.add_argument("--out", required=True, help="output file (.wav, .flac or .ogg)")
    synth.add_argument("--srt", help="also write sentence timestamps as SRT")
    synth.add_argument("--vtt", help="also write sentence timestamps as WebVTT")
    synth.add_argument("--quiet", action="store_true", help="no progress bar")
    synth.add_argument(
        "--takes",
        type=int,
        default=None,
        help="make a take again with the next seed while it fails its quality checks, up to this many "
        "(default 1: checked, not made again; docs/quality.md)",
    )
    add_threshold_arguments(synth, "this synthesis's")
    synth.add_argument("--json", action="store_true", help="print the result and its scores as one JSON line")
    add_model_arguments(synth)
    synth.set_defaults(func=cmd_synthesize)

    voices = sub.add_parser("voices", help="manage saved voices")
    vsub = voices.add_subparsers(dest="voices_command", required=True, metavar="ACTION")
    add = vsub.add_parser("add", help="enrol a voice from a recording")
    add.add_argument("name")
    add.add_argument("--wav", required=True, help="the recording of the voice, 3-30 s")
    add.add_argument("--transcript", default=None, help="exactly what the recording says")
    add.add_argument(
        "--consent",
        action="store_true",
        help="confirm that the person whose voice this is agreed to its cloning (recorded with the voice)",
    )
    add_model_arguments(add)
    for action, help_text in (
        ("list", "list saved voices"),
        ("rm", "delete a voice"),
        ("rename", "rename a voice"),
    ):
        parser = vsub.add_parser(action, help=help_text)
        if action != "list":
            parser.add_argument("name")
        if action == "rename":
            parser.add_argument("new_name")
        parser.add_argument("--data-dir", type=Path, default=None)
    voices.set_defaults(func=cmd_voices)
