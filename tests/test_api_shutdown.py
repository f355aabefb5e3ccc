"""SIGTERM on a real `cosyserve serve`: work in flight finishes, new work is refused at once with 503."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from tests.conftest import LONG_TEXT, enrol_voice

from server_process import ServerProcess

pytestmark = pytest.mark.slow


def test_sigterm_lets_the_request_in_flight_finish_and_refuses_new_ones_at_once(
    demo_model_path: Path, tmp_path: Path, prompt_wav_bytes: bytes
) -> None:
    server = ServerProcess(demo_model_path, tmp_path / "data").start()
    try:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            enrol_voice(client, "alice", prompt_wav_bytes)
            in_flight: dict[str, httpx.Response] = {}

            def long_request() -> None:
                in_flight["response"] = client.post("/v1/tts", json={"text": LONG_TEXT, "voice": "alice"})

            worker = threading.Thread(target=long_request)
            worker.start()
            deadline = time.monotonic() + 30
            while not _running(server):
                assert time.monotonic() < deadline, "the request never started running"
                time.sleep(0.05)
            server.signal(signal.SIGTERM)
            time.sleep(0.1)
            started = time.monotonic()
            refused = httpx.post(
                f"{server.url}/v1/tts", json={"text": "你好。", "voice": "alice"}, timeout=10
            )
            assert time.monotonic() - started < 1.0
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
            assert "retry-after" in refused.headers
            assert httpx.get(f"{server.url}/ready", timeout=5).status_code == 503
            worker.join(timeout=120)
        finished = in_flight["response"]
        assert finished.status_code == 200 and len(finished.content) > 10_000
        assert server.process is not None and server.process.wait(timeout=60) in (0, -signal.SIGTERM)
    finally:
        server.stop()


def _running(server: ServerProcess) -> bool:
    """Whether the scheduler reports work on a worker (`cosyserve_in_flight` on /metrics)."""
    for line in httpx.get(f"{server.url}/metrics", timeout=5).text.splitlines():
        if line.startswith("cosyserve_in_flight "):
            return float(line.split()[-1]) >= 1
    return False
