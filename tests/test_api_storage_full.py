"""A full disk, for real (a 2 MB tmpfs as the output directory): nothing claims to be saved that wasn't,
and /ready says why the server can't keep results."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from tests.conftest import API_TEXT, enrol_voice

CAPACITY = "2m"


@pytest.fixture
def full_disk(tmp_path: Path):
    """A mounted tmpfs of CAPACITY, filled to the last few kB (root is needed to mount it)."""
    mount = tmp_path / "outputs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={CAPACITY}", "tmpfs", str(mount)], check=False
    )
    if done.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(
                "mounting a tmpfs failed: the full-disk tests need root (scripts/test.sh runs as root)"
            )
        pytest.skip("mounting a tmpfs needs root")
    try:
        with open(mount / "filler", "wb") as filler:
            try:
                while True:
                    filler.write(b"\0" * 65536)
                    filler.flush()
            except OSError:
                pass
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_reported_and_nothing_claims_to_be_saved(
    start_api_server, prompt_wav_bytes, full_disk: Path
) -> None:
    live = start_api_server(output_dir=str(full_disk), min_free_mb=0, wait_ready=False)
    try:
        deadline = time.monotonic() + 60
        while live.service.model_state != "ready":  # /ready itself stays 503: the disk is full
            assert time.monotonic() < deadline, "the model did not load"
            time.sleep(0.05)
        with live.client() as client:
            enrol_voice(client, "alice", prompt_wav_bytes)
            response = client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice"})
            assert response.status_code == 200 and len(response.content) > 1000  # the caller gets its audio
            assert response.headers["x-cosyserve-saved"] == "false"
            said = response.headers["x-cosyserve-storage-error"]  # the reason, not the server's folder
            assert "No space left" in said and str(full_disk) not in said
            assert "x-cosyserve-output-id" not in response.headers
            assert client.get("/v1/outputs").json()["data"] == []
            ready = client.get("/ready")
            assert ready.status_code == 503
            said = ready.json()["error"]["message"]  # to anyone: no path, no system error
            assert said.startswith("storage: results can't be saved") and str(full_disk) not in said
            status = client.get("/admin/status").json()["readiness"]  # (auth is off: the caller is admin)
            assert "No space left" in status["reason"]
            (full_disk / "filler").unlink()  # room again: the next check finds the directory usable
            live.service.outputs.health._checked_at = None
            assert client.get("/ready").status_code == 200
    finally:
        live.stop()
