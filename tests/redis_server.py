"""A throwaway redis-server for the test session (the `redis_url` fixture).

`redis-server` from PATH on 127.0.0.1 at a free port, no persistence, its files in a temp dir. Without it
(or the redis package) the tests that use it are skipped, except in CI (CI=true), where they fail:
`scripts/test.sh` installs it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

START_TIMEOUT_S = 15


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(
            f"{reason}: install redis-server and the `distributed` extra for the distributed-mode tests"
        )
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """`redis://127.0.0.1:PORT/0` of a private redis-server, flushed by nobody: tests use their own keys."""
    binary = shutil.which("redis-server")
    if binary is None:
        _missing("redis-server is not installed")
    try:
        import redis
    except ImportError:
        _missing("the redis package is not installed")
    base = Path(tempfile.mkdtemp(prefix="cosyserve-redis-"))
    port = _free_port()
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(base),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"redis-server did not start on port {port}")
            time.sleep(0.05)
    try:
        yield url
    finally:
        client.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(base, ignore_errors=True)
