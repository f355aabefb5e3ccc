"""The first hour of a new user: each failure ends with one line that names the next step, and the exit
status of `exit_codes.ExitCode` (the README's table). In-process `main([...])` calls; the hubs are
made unreachable by replacing the probe, so no test waits on a network."""

from __future__ import annotations

import importlib.util
import re
import socket
from pathlib import Path

import pytest

from cosyserve import cli
from cosyserve.cli import main
from cosyserve.commands.parsing import looks_like_text
from cosyserve.errors import InputError, MissingExtra, ModelDirError, SettingsError, exit_code_for
from cosyserve.exit_codes import MEANINGS, ExitCode
from cosyserve.modeldir import download, hub_probe
from cosyserve.modeldir.download import DownloadError

REPO_ROOT = Path(__file__).resolve().parents[1]
UNREACHABLE = "gaierror: Name or service not known (test)"


@pytest.fixture
def fresh_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No model downloaded, no hub reachable, no fetch ever started."""
    monkeypatch.setenv("COSYSERVE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    for name in ("COSYSERVE_MODEL", "COSYSERVE_DOWNLOAD_SOURCE", "COSYSERVE_QUEUE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hub_probe, "probe_hubs", lambda hubs, *a, **k: dict.fromkeys(hubs, UNREACHABLE))

    def no_fetch(*args, **kwargs):
        raise AssertionError("an unreachable hub was fetched from")

    monkeypatch.setattr(download, "FETCHERS", {"huggingface": no_fetch, "modelscope": no_fetch})
    return tmp_path


def _one_error_line(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(f"cosyserve {command}: error: ")]
    assert len(errors) == 1, err
    assert "Traceback" not in err
    return errors[0]


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "usage:" not in err, err
    return err.strip()


def test_synthesize_without_model_or_hubs_suggests_demo_and_download(
    fresh_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompt = fresh_home / "p.wav"
    prompt.write_bytes(b"RIFF")
    argv = ["synthesize", "--text", "你好", "--prompt-wav", str(prompt), "--out", str(fresh_home / "a.wav")]
    assert main(argv) == ExitCode.UNAVAILABLE
    line = _one_error_line(capsys.readouterr().err, "synthesize")
    assert "no hub can be reached" in line and "--model demo" in line
    assert "cosyserve download FunAudioLLM/Fun-CosyVoice3-0.5B-2512" in line


def test_serve_without_model_or_hubs_fails_before_starting(
    fresh_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "--model", "someone/not-a-model", "--models-dir", str(fresh_home / "models")]
    assert main([*argv, "--data-dir", str(fresh_home / "d")]) == ExitCode.UNAVAILABLE
    line = _one_error_line(capsys.readouterr().err, "serve")
    assert "cosyserve download someone/not-a-model" in line and "--model demo" in line


def test_normalize_without_a_model_shows_the_text_rules(
    fresh_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["normalize", "今天是2024年1月1日。"]) == ExitCode.OK
    captured = capsys.readouterr()
    assert "spoken       今天是二零二四年一月一日。" in captured.out
    assert "LM reads" not in captured.out  # no tokenizer: no tokens shown
    assert "need a model's tokenizer" in captured.err and "--model demo" in captured.err


def test_normalize_json_without_a_model_says_there_are_no_tokens(
    fresh_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["normalize", "--json", "It costs $5. That is all."]) == ExitCode.OK
    out = capsys.readouterr().out
    assert '"tokenizer": null' in out and '"lm_inputs": []' in out


def test_normalize_with_a_model_id_not_downloaded(
    fresh_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["normalize", "--model", "someone/else", "hi"]) == ExitCode.UNAVAILABLE
    assert "cosyserve download someone/else" in _one_error_line(capsys.readouterr().err, "normalize")


def test_a_text_that_starts_with_a_dash_gets_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(["normalize", "-5度"], capsys)
    assert err.startswith("cosyserve normalize: error: unrecognized arguments: -5度")
    assert "(cosyserve normalize -- -5度)" in err
    err = _usage_error(["synthesize", "--out", "x.wav", "--text", "-5度"], capsys)
    assert "write --text=-5度" in err


def test_usage_errors_are_one_line_without_hints_for_flags(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(["synthesize", "--text", "hi", "--out", "x.wav", "--bogus"], capsys)
    assert "unrecognized arguments: --bogus" in err and "starts with '-'" not in err
    assert err.endswith("see `cosyserve synthesize --help`")
    assert "--out" in _usage_error(["synthesize", "--text", "hi"], capsys)
    # a misspelt flag is the news even when a required one is missing too (it said "--out is required")
    err = _usage_error(["synthesize", "--bogus", "--text", "hi"], capsys)
    assert "unrecognized arguments: --bogus" in err and "required" not in err, err
    assert "ambiguous option: --tex" in _usage_error(["synthesize", "--tex", "hi"], capsys)


def test_looks_like_text() -> None:
    assert all(looks_like_text(t) for t in ("-5度", "-5", "-你好", "-hello world", "--。"))
    assert not any(looks_like_text(t) for t in ("--text", "-h", "--", "-", "--max-chars"))


def test_queue_without_the_distributed_extra(
    fresh_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "celery" else real_find_spec(name, *a)
    )
    for command in ("serve", "worker"):
        argv = [command, "--queue", "redis://127.0.0.1:1/0", "--data-dir", str(fresh_home / "d")]
        assert main(argv) == ExitCode.UNAVAILABLE
        line = _one_error_line(capsys.readouterr().err, command)
        assert "--queue (distributed mode) needs celery" in line
        assert line.endswith("pip install 'cosyserve[distributed]'")


def test_an_optional_module_missing_anywhere_names_its_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def needs_modelscope(args):
        raise ModuleNotFoundError("No module named 'modelscope'", name="modelscope")

    monkeypatch.setattr(cli, "_cmd_download", needs_modelscope)
    assert main(["download"]) == ExitCode.UNAVAILABLE
    assert "pip install 'cosyserve[download]'" in _one_error_line(capsys.readouterr().err, "download")


def test_parity_on_a_wrong_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["parity", str(tmp_path / "nope")]) == ExitCode.USAGE
    assert "is not a directory" in _one_error_line(capsys.readouterr().err, "parity")
    assert main(["parity", str(tmp_path)]) == ExitCode.USAGE
    line = _one_error_line(capsys.readouterr().err, "parity")
    assert "holds no model/" in line and "--model" not in line
    (tmp_path / "model").mkdir()
    assert main(["parity", str(tmp_path)]) == ExitCode.FAILED  # a fixture whose model is damaged
    out = capsys.readouterr().out
    assert "is incomplete" in out and "--model" not in out


def test_interrupt_and_failure_statuses(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_cmd_download", interrupted)
    assert main(["download"]) == ExitCode.INTERRUPTED
    assert "interrupted" in capsys.readouterr().err


def test_exit_code_for_each_kind_of_error() -> None:
    assert exit_code_for(InputError("x")) == exit_code_for(SettingsError("x")) == ExitCode.USAGE == 2
    assert exit_code_for(DownloadError("x", model_id="a/b", reason="r")) == ExitCode.UNAVAILABLE == 3
    assert exit_code_for(ModelDirError("x")) == exit_code_for(MissingExtra("m", "asr", "x")) == 3
    assert exit_code_for(RuntimeError("x")) == ExitCode.FAILED == 1
    assert exit_code_for(KeyboardInterrupt()) == ExitCode.INTERRUPTED == 130


def test_the_readme_documents_every_exit_code() -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\d+)` \| (.+?) \|$", readme, flags=re.MULTILINE))
    assert {int(code) for code in rows} == {int(code) for code in MEANINGS}


# The probe itself, against local sockets: a refused port and a name that cannot resolve.


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_probe_finds_a_refused_connection_and_an_unknown_name() -> None:
    port = _closed_port()
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "MODELSCOPE_DOMAIN": "no-such-host.invalid"}
    reasons = hub_probe.probe_hubs(["huggingface", "modelscope"], env, timeout_s=3)
    assert reasons["huggingface"].startswith("ConnectionRefusedError")
    assert reasons["modelscope"] is not None  # gaierror, or a timeout where the resolver hangs


def test_probe_reports_a_listening_hub_as_reachable() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        env = {"HF_ENDPOINT": f"http://127.0.0.1:{server.getsockname()[1]}"}
        assert hub_probe.probe_hubs(["huggingface"], env, timeout_s=3) == {"huggingface": None}


def test_probe_goes_through_the_https_proxy_unless_no_proxy() -> None:
    env = {"HTTPS_PROXY": "http://proxy.local:3128", "MODELSCOPE_DOMAIN": "ms.example"}
    assert hub_probe.hub_address("huggingface", env) == ("proxy.local", 3128)
    assert hub_probe.hub_address("modelscope", {**env, "NO_PROXY": ".example"}) == ("ms.example", 443)
    assert hub_probe.hub_address("huggingface", {}) == ("huggingface.co", 443)


def test_a_refused_connection_is_not_retried_but_a_cut_transfer_is(tmp_path: Path) -> None:
    calls: list[str] = []

    def refused(model_id, target_dir, *, skip_patterns, progress):
        calls.append("refused")
        raise OSError("hub client failed") from ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(DownloadError, match=r"huggingface \(1 attempt\): ConnectionRefusedError"):
        download.download_model(
            "a/b",
            target_dir=tmp_path / "m",
            source="huggingface",
            progress=False,
            fetchers={"huggingface": refused},
            attempts_per_source=3,
        )
    assert calls == ["refused"]


def test_hubs_the_probe_finds_out_of_reach_are_not_fetched(tmp_path: Path) -> None:
    def never(*args, **kwargs):
        raise AssertionError("fetched")

    with pytest.raises(DownloadError, match="no hub can be reached") as caught:
        download.download_model(
            "a/b",
            target_dir=tmp_path / "m",
            progress=False,
            fetchers={"huggingface": never, "modelscope": never},
            probe=lambda hubs: dict.fromkeys(hubs, UNREACHABLE),
        )
    assert caught.value.reason == UNREACHABLE


def test_a_path_that_cannot_be_written_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["demo-model", str(blocker / "model")]) == ExitCode.FAILED
    line = _one_error_line(capsys.readouterr().err, "demo-model")
    assert str(blocker) in line and "check the path" in line


def test_a_model_that_is_neither_directory_nor_id(
    fresh_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "synthesize",
        "--model",
        str(fresh_home / "nope"),
        "--text",
        "hi",
        "--voice",
        "x",
        "--out",
        "a.wav",
    ]
    assert main(argv) == ExitCode.UNAVAILABLE
    line = _one_error_line(capsys.readouterr().err, "synthesize")
    assert "does not exist" in line and "or demo" in line


def test_a_worker_whose_queue_does_not_answer_stops_with_one_line(
    fresh_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to run on, its consumer logging a refused connection every few seconds (as if alive)."""
    from cosyserve.commands.worker import redact_url

    url = f"redis://:s3cret@127.0.0.1:{_closed_port()}/0"
    argv = ["worker", "--queue", url, "--model", "demo", "--data-dir", str(fresh_home / "d")]
    assert main(argv) == ExitCode.UNAVAILABLE
    line = _one_error_line(capsys.readouterr().err, "worker")
    assert "does not answer" in line and "start Redis there" in line and "s3cret" not in line, line
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_a_server_address_without_its_scheme_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """It was tried as given and ended "the server could not be reached" with exit status 3."""
    for command in ("batch", "dub"):
        argv = [command, "in.csv", "--voice", "me", "--out", "o", "--server", "127.0.0.1:7860"]
        err = _usage_error(argv, capsys)
        assert "give it with its scheme, e.g. http://127.0.0.1:7860" in err, err


def test_an_output_that_cannot_be_written_is_one_line_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was a traceback from the sound-file library, after the synthesis (a team's first hour)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    (tmp_path / "folder.wav").mkdir()
    no_model = str(tmp_path / "no-model")  # never reached: the paths are checked first
    for out in (blocker / "a.wav", tmp_path / "folder.wav"):
        args = ["synthesize", "--model", no_model, "--text", "你好", "--prompt-wav", str(blocker)]
        assert main([*args, "--out", str(out)]) == ExitCode.USAGE
        line = _one_error_line(capsys.readouterr().err, "synthesize")
        assert str(out) in line and "model" not in line, line


def test_a_bad_text_limit_is_a_usage_error_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COSYSERVE_MAX_TEXT_CHARS", "abc")
    assert main(["keys", "list", "--data-dir", str(tmp_path)]) == ExitCode.USAGE  # the settings' line
    assert "COSYSERVE_MAX_TEXT_CHARS" in _one_error_line(capsys.readouterr().err, "keys")
    with pytest.raises(SystemExit) as stopped:
        main(["synthesize", "--text", "你好", "--out", "x.wav", "--voice", "v"])
    assert stopped.value.code == ExitCode.USAGE
    line = _one_error_line(capsys.readouterr().err, "synthesize")
    assert "'abc'" in line and "COSYSERVE_MAX_TEXT_CHARS" in line
    monkeypatch.delenv("COSYSERVE_MAX_TEXT_CHARS")
    with pytest.raises(SystemExit):
        main(["synthesize", "--text", "你好", "--out", "x.wav", "--voice", "v", "--max-chars", "-5"])
    assert "'-5' is no text limit" in capsys.readouterr().err


def test_an_unknown_command_points_at_a_help_that_exists(capsys: pytest.CaptureFixture[str]) -> None:
    """It pointed at `cosyserve frobnicate --help`, which fails too."""
    for argv, helped in (
        (["frobnicate"], "`cosyserve --help`"),
        (["voices", "remove", "x"], "`cosyserve voices --help`"),
    ):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == ExitCode.USAGE
        err = capsys.readouterr().err
        assert "invalid choice" in err and err.rstrip().endswith(f"see {helped}"), err


def test_a_text_file_that_is_a_folder_or_not_utf8_is_said_plainly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Python's own words came through ("[Errno 21] Is a directory", "'utf-8' codec can't decode")."""
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café".encode("latin-1"))
    for path, said in ((tmp_path, "is a folder: give the text file itself"), (latin, "is not UTF-8 text")):
        assert main(["normalize", "--text-file", str(path)]) == ExitCode.USAGE
        line = _one_error_line(capsys.readouterr().err, "normalize")
        assert said in line and "Errno" not in line and "codec" not in line, line


def test_a_misspelt_data_dir_is_said_and_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`voices list --data-dir /tmp/tpyo` made the folder and answered "no voices yet"."""
    typo = tmp_path / "tpyo"
    for argv in (["voices", "list"], ["voices", "rm", "narrator"], ["keys", "list"], ["keys", "revoke", "1"]):
        assert main([*argv, "--data-dir", str(typo)]) == ExitCode.USAGE
        line = _one_error_line(capsys.readouterr().err, argv[0])
        assert f"no cosyserve data at {typo}" in line and "--data-dir" in line, line
    speak = [
        "synthesize",
        "--model",
        "demo",
        "--voice",
        "alice",
        "--text",
        "hi",
        "--out",
        str(tmp_path / "o.wav"),
    ]
    assert main([*speak, "--data-dir", str(typo)]) == ExitCode.USAGE  # it made a database and secret there
    assert f"no cosyserve data at {typo}" in _one_error_line(capsys.readouterr().err, "synthesize")
    assert not typo.exists()
    assert main(["keys", "create", "first", "--quiet", "--data-dir", str(typo)]) == 0  # creating makes it
    assert main(["keys", "list", "--data-dir", str(typo)]) == 0
    assert "first" in capsys.readouterr().out


def test_the_version_names_the_source_it_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """ "cosyserve 0.1.0" named every build of 500 commits: an upgrade could not be confirmed by it."""
    from cosyserve.build_info import source_digest

    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    line = capsys.readouterr().out.strip()
    assert re.fullmatch(r"cosyserve \S+ \(source [0-9a-f]{12}\)", line) and source_digest() in line, line


def test_a_database_that_cannot_be_used_is_one_line(capsys) -> None:
    """A PostgreSQL server that is down, or another kind of database, was a 220-line traceback."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there
    down = f"postgresql+psycopg://u:secret@127.0.0.1:{port}/x"
    assert main(["keys", "list", "--database-url", down]) == ExitCode.UNAVAILABLE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the database could not be used" in err[0] and "secret" not in err[0], err
    assert main(["keys", "list", "--database-url", "mysql://u:secret@127.0.0.1/x"]) == ExitCode.USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "SQLite" in err[0] and "PostgreSQL" in err[0] and "secret" not in err[0], err


def test_a_full_disk_is_one_line(monkeypatch, capsys) -> None:
    def full(args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli, "build_parser", lambda: _parser_running(full))
    assert main(["normalize", "x"]) == ExitCode.FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["cosyserve normalize: error: No space left on device; check the path, its permissions and "
                   "the free space"]  # fmt: skip


def _parser_running(func):
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("command")
    parser.add_argument("rest", nargs="*")
    parser.set_defaults(func=func)
    return parser


def test_an_error_during_a_progress_bar_gets_a_line_of_its_own(capsys) -> None:
    """`synthesizing:  0%|          | 0/3` and the error were printed on one line."""
    import sys

    from tqdm import tqdm

    bar = tqdm(total=3, unit="sentence", desc="synthesizing", file=sys.stderr)
    bar.update(1)
    assert cli.report_error("synthesize", InputError("the voice is gone")) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "\ncosyserve synthesize: error: the voice is gone\n" in err and "1/3" in err


def test_output_piped_into_head_ends_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cosyserve normalize … | head -1`: the reader goes away; a traceback said BrokenPipeError."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    code = "import sys; from cosyserve.cli import main; sys.exit(main(['normalize', '--', '-5度']))"
    done = subprocess.run([sys.executable, "-c", code], stdout=write, stderr=subprocess.PIPE, text=True)
    os.close(write)
    assert (done.returncode, done.stderr) == (ExitCode.OUTPUT_CLOSED, "")


def test_a_server_raises_its_open_files_limit_to_the_hard_one() -> None:
    """At systemd's soft 1024 a few hundred idle connections made other users' saves fail with EMFILE."""
    import subprocess
    import sys

    code = (
        "import resource; from cosyserve.commands.open_files import raise_open_files_limit as up\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "print(up(wanted=min(4096, hard)), min(4096, hard), resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    got, wanted, now = map(int, done.stdout.split())
    assert got == wanted == now and wanted > 256
