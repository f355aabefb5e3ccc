"""`cosyserve serve` as a separate process for tests that measure it (memory, signals, restarts)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("COSYSERVE_")}
    return {**clean, "PYTHONUNBUFFERED": "1"}


class ServerProcess:
    """`cosyserve serve` on a free port with its own data directory; `start()` waits for /ready."""

    def __init__(self, model: Path | str, data_dir: Path, *flags: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            sys.executable, "-m", "cosyserve.cli", "serve", "--model", str(model), "--device", "cpu",
            "--port", str(self.port), "--data-dir", str(data_dir), "--threads", "1", *flags,
        ]  # fmt: skip
        self.log = data_dir.parent / f"server-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120.0) -> ServerProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=clean_env())
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.process.poll() is None, f"the server exited: {self.log.read_text()[-3000:]}"
            try:
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.2)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def memory_mb(self, field: str = "VmRSS") -> float:
        """VmRSS (now) or VmHWM (peak since the last `reset_peak`) of the server, in MB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        raise KeyError(field)

    def reset_peak(self) -> None:
        """Start VmHWM again from the current RSS (Linux `clear_refs`)."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")

    def signal(self, signum: int = signal.SIGTERM) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode
