"""`cosyserve serve` as a real process: it starts, serves, refuses unsafe binds, stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from tests.conftest import API_TEXT, LONG_TEXT, REPO_ROOT, enrol_voice

from cosyserve.cli import main as cli_main
from cosyserve.errors import InputError
from cosyserve.service.stores.db import make_engine
from cosyserve.service.stores.jobs import JobStore


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cosyserve.cli", *args]


def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("COSYSERVE_")}
    return {**clean, "PYTHONUNBUFFERED": "1"}


def test_public_bind_without_auth_refuses_to_start(tmp_path: Path, capsys) -> None:
    assert cli_main(["serve", "--model", "demo", "--host", "0.0.0.0", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "refusing to listen on 0.0.0.0" in err and "--insecure" in err


def test_bad_flag_values_are_clear_errors(tmp_path: Path, capsys) -> None:
    assert cli_main(["serve", "--port", "0", "--data-dir", str(tmp_path)]) == 2
    assert "server.port" in capsys.readouterr().err
    assert cli_main(["serve", "--concurrency", "many", "--data-dir", str(tmp_path)]) == 2
    assert "--concurrency" in capsys.readouterr().err


def test_a_port_in_use_is_one_line_before_the_model_loads(tmp_path: Path, capsys) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = [
            "serve",
            "--model",
            str(tmp_path / "no-model"),
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path),
        ]
        assert cli_main([*args[:-1], str(tmp_path / "data")]) == 2  # the missing model is never reached
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and f"127.0.0.1:{port} is already in use" in err[0] and "--port" in err[0], err
    assert not (tmp_path / "data").exists()  # a refused start leaves no data directory behind


def test_launchers_are_the_serve_command(tmp_path: Path) -> None:
    for command in (
        [sys.executable, str(REPO_ROOT / "app.py"), "--help"],
        [str(REPO_ROOT / "run.sh"), "--help"],
    ):
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env(), cwd=tmp_path)
        assert result.returncode == 0 and "usage: cosyserve serve" in result.stdout


def test_serve_answers_then_stops_cleanly_on_sigterm(
    demo_model_path: Path, tmp_path: Path, prompt_wav_bytes
) -> None:
    port = free_port()
    args = [
        "serve",
        "--model",
        str(demo_model_path),
        "--device",
        "cpu",
        "--port",
        str(port),
        "--data-dir",
        str(tmp_path / "data"),
        "--threads",
        "2",
        "--log-json",
        "--log-file",
        str(tmp_path / "logs" / "cosyserve.log"),
        "--request-timeout-s",
        "5",
    ]  # fmt: skip  (the shutdown grace period is min(30 s, this))
    process = subprocess.Popen(
        cli(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(), cwd=tmp_path
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stdout.read()
            log = tmp_path / "logs" / "cosyserve.log"
            ours = log.exists() and "Uvicorn running on" in log.read_text()  # (not another test's server
            try:  # that took the port free_port saw free: it answered /ready and needed a key)
                if ours and httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.2)
        with httpx.Client(base_url=base, timeout=60) as client:
            assert client.get("/health").json()["status"] == "ok"
            enrol_voice(client, "alice", prompt_wav_bytes)
            assert client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice"}).status_code == 200
            job_id = client.post("/v1/jobs", json={"text": LONG_TEXT, "voice": "alice"}).json()["id"]
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode in (0, -signal.SIGTERM), output  # uvicorn re-raises the signal it caught
    assert '"message": "scheduler stopped' in output  # JSON log lines
    record = JobStore(make_engine(f"sqlite:///{tmp_path / 'data' / 'cosyserve.db'}")).get(job_id)
    # finished within the grace period, or kept in the queue for the next start (never lost or failed)
    assert record is not None and record.state in ("done", "queued")
    # Recordings, outputs with their texts, the log: the server's user's alone, as the database was
    # (they were 0644 in 0755 folders, readable by every account on the host).
    made = list(tmp_path.rglob("*"))
    assert any(p.suffix == ".wav" for p in made) and any(p.name == "cosyserve.log" for p in made)
    assert {
        str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in made if p.stat().st_mode & 0o077
    } == {}


def test_flags_override_environment_override_config_file(tmp_path: Path, monkeypatch) -> None:
    from cosyserve.cli import build_parser
    from cosyserve.commands.serve import load_settings

    config = tmp_path / "cosyserve.toml"
    config.write_text('port = 7000\nqueue_size = 3\n[server]\nhost = "127.0.0.2"\n', encoding="utf-8")
    monkeypatch.setenv("COSYSERVE_PORT", "7100")
    monkeypatch.setenv("COSYSERVE_QUEUE__QUEUE_SIZE", "5")
    args = build_parser().parse_args(["serve", "--config", str(config), "--port", "7200", "--no-insecure"])
    settings = load_settings(args, args.settings_dests)
    assert settings.server.port == 7200  # flag
    assert settings.queue.queue_size == 5  # environment
    assert settings.server.host == "127.0.0.2"  # config file
    assert settings.server.insecure is False and settings.engine.device == "auto"  # flag, default


def test_a_second_server_on_one_data_dir_is_refused(tmp_path: Path, capsys) -> None:
    """It read the first one's running job as left behind, ran it again and charged its key twice."""
    from cosyserve.commands.data_dir_lock import hold_data_dir

    first = hold_data_dir(tmp_path)  # a server holding the folder (a lock is per open file)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = ["serve", "--model", str(tmp_path / "no-model"), "--port", str(port), "--data-dir", str(tmp_path)]
    assert cli_main(args) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and f"another cosyserve server (pid {os.getpid()}) serves" in err[0], err
    first.close()  # stopped (or died: the system drops its lock)
    hold_data_dir(tmp_path).close()


def test_a_second_server_on_one_output_dir_is_refused_too(tmp_path: Path, capsys) -> None:
    """With its own --data-dir and the first one's outputs it listed the first server's users' outputs to
    its own keys of the same ids, and ran its retention over them."""
    from cosyserve.commands.data_dir_lock import hold_single_server

    database = f"sqlite:///{tmp_path / 'a' / 'cosyserve.db'}"
    first = hold_single_server(tmp_path / "a", database, tmp_path / "a" / "outputs")
    args = ["serve", "--model", str(tmp_path / "no-model"), "--data-dir", str(tmp_path / "b")]
    assert cli_main([*args, "--output-dir", str(tmp_path / "a" / "outputs")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and "serves the output directory" in err[0], err
    first.close()


def test_a_second_server_on_one_database_is_refused_too(tmp_path: Path, capsys) -> None:
    """Another --data-dir with the first one's --database-url read its running job as left behind too."""
    from cosyserve.commands.data_dir_lock import hold_single_server

    database = f"sqlite:///{tmp_path / 'first' / 'cosyserve.db'}"
    first = hold_single_server(tmp_path / "first", database)
    with pytest.raises(InputError, match=r"serves the database .*first/cosyserve\.db"):
        hold_single_server(tmp_path / "second", database)
    hold_single_server(tmp_path / "third", f"sqlite:///{tmp_path / 'third' / 'cosyserve.db'}").close()
    first.close()
    hold_single_server(tmp_path / "second", database).close()  # the first one stopped
