"""Start-up that tells the truth: a model that can't load ends `serve` with one actionable line."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest
from tests.test_api_serve_cli import cli, env, free_port

from cosyserve.errors import CheckpointError, InputError, ModelDirError
from cosyserve.modeldir.download import DownloadError
from cosyserve.service.local.load_failure import MAX_MESSAGE_CHARS, load_failure_message

MODEL = "someone/not-a-model"


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            DownloadError("…", model_id=MODEL, reason="gaierror: [Errno -2] Name or service not known"),
            "cosyserve download someone/not-a-model",
        ),
        (
            InputError("device 'cuda' requested but CUDA is not available here: use --device cpu"),
            "--device cpu",
        ),
        (ModelDirError("llm.pt is missing from /models/x " + "x" * 500), "cosyserve download"),
        (CheckpointError("flow.pt: unexpected key"), "cosyserve download"),
        (RuntimeError("something else entirely"), "--device cpu"),
    ],
)
def test_load_failure_message_is_one_short_actionable_line(error: BaseException, expected: str) -> None:
    message = load_failure_message(MODEL, error)
    assert len(message) < MAX_MESSAGE_CHARS and "\n" not in message
    assert message.startswith(f"could not load model {MODEL}: ")
    assert expected in message and "--model demo" in message
    already = load_failure_message("demo", error)  # not "try --model demo" to a user already on it
    assert "--model demo" not in already and already.startswith("could not load model demo: ")


def _serve(tmp_path: Path, *flags: str) -> subprocess.Popen[str]:
    args = ["serve", "--port", str(free_port()), "--data-dir", str(tmp_path / "data"), *flags]
    return subprocess.Popen(
        cli(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=tmp_path
    )


def _last_error_line(stderr: str) -> str:
    return next(line for line in reversed(stderr.splitlines()) if line.startswith("cosyserve serve: error:"))


@pytest.mark.slow
def test_unreachable_model_id_exits_with_one_message(tmp_path: Path) -> None:
    """No network in CI: both hubs fail; the server must not stay up looking alive (≤ 40 s)."""
    started = time.monotonic()
    process = _serve(tmp_path, "--model", MODEL, "--models-dir", str(tmp_path / "models"))
    try:
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    elapsed = time.monotonic() - started
    assert process.returncode not in (0, None), stderr
    assert elapsed <= 40, f"took {elapsed:.0f} s"
    line = _last_error_line(stderr)
    message = line.removeprefix("cosyserve serve: error: ")
    assert len(message) < MAX_MESSAGE_CHARS and "--model demo" in message, line


def test_missing_device_exits_at_once(tmp_path: Path, demo_model_path: Path) -> None:
    process = _serve(tmp_path, "--model", str(demo_model_path), "--device", "cuda:7")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "--device cpu" in _last_error_line(stderr)


def test_keep_serving_on_load_error_keeps_the_server_up(tmp_path: Path, demo_model_path: Path) -> None:
    port_flag = free_port()
    process = subprocess.Popen(
        cli(
            "serve",
            "--port",
            str(port_flag),
            "--data-dir",
            str(tmp_path / "data"),
            "--model",
            str(demo_model_path),
            "--device",
            "cuda:7",
            "--keep-serving-on-load-error",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env(),
        cwd=tmp_path,
    )
    try:
        base = f"http://127.0.0.1:{port_flag}"
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, "the server exited"
            try:
                ready = httpx.get(f"{base}/ready", timeout=2)
                if "failed to load" in ready.json().get("error", {}).get("message", ""):
                    break
            except (httpx.TransportError, ValueError):
                pass
            assert time.monotonic() < deadline, "the load did not fail in time"
            time.sleep(0.2)
        assert ready.status_code == 503 and "CUDA" in ready.json()["error"]["message"]
        assert httpx.get(f"{base}/health", timeout=2).status_code == 200
        time.sleep(1.0)
        assert process.poll() is None
    finally:
        process.terminate()
        process.wait(timeout=30)
