"""The GPU check's service steps: `cosyserve serve` on the demo model as a subprocess, driven over HTTP.

- service_load: concurrent streaming and one-shot /v1/tts requests with the server's memory tracked
  (GPU memory from nvidia-smi, else the process's RSS): every answer audio, no growth, /ready after.
- out_of_memory: the server started through this file's `--serve` wrapper, which caps the process's
  CUDA memory (`torch.cuda.set_per_process_memory_fraction`) and makes long requests allocate past the
  cap, a real allocator OOM: the request must get a 503 `out_of_memory` with Retry-After, /ready must
  stay ready, a short request must still work, and an engine restart must bring /ready back.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpu_check_common import CheckFailed, Context, subprocess_env

PROMPT_TRANSCRIPT = "希望你以后能够做的比我还好呦。"
SHORT_TEXT = "你好。"
LONG_TEXT = "今天的天气非常好我们一起去公园散步看看湖边的风景顺便买一些新鲜的水果回家" * 3  # one sentence
OOM_OVER_TOKENS = 100  # the wrapper's long-request threshold: short requests stay far below it


class Server:
    """`cosyserve serve` in a subprocess on a free local port."""

    def __init__(
        self, ctx: Context, name: str, wrapper: list[str] | None = None, concurrency: int = 1
    ) -> None:
        from cosyserve.modeldir.demo_model import write_demo_model

        model = ctx.work / "demo"
        if not model.exists():
            write_demo_model(model, seed=0)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        data = ctx.work / f"data-{name}"
        serve = ["serve", "--model", str(model), "--device", str(ctx.device), "--host", "127.0.0.1",
                 "--port", str(self.port), "--data-dir", str(data), "--concurrency", str(concurrency),
                 "--queue-size", "64"]  # fmt: skip
        command = [sys.executable, __file__, "--serve", *(wrapper or []), "--", *serve]
        self.log = (ctx.work / f"server-{name}.log").open("w")
        self.process = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, env=subprocess_env()
        )

    def wait_ready(self, timeout_s: float = 180) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise CheckFailed(f"the server exited with {self.process.returncode}", {"log": self.tail()})
            status, body, _ = request(self.url + "/ready", timeout_s=5)
            if status == 200:
                return json.loads(body)
            time.sleep(0.5)
        raise CheckFailed("the server did not become ready", {"log": self.tail()})

    def tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def request(url: str, body: dict[str, Any] | None = None, timeout_s: float = 300) -> tuple[int, bytes, dict]:
    data = None if body is None else json.dumps(body).encode()
    method = "GET" if body is None else "POST"
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        return 0, str(exc).encode(), {}


def tts(server: Server, prompt: str, text: str, stream: bool, seed: int) -> tuple[int, bytes, dict]:
    body = {
        "text": text,
        "prompt_wav": prompt,
        "prompt_text": PROMPT_TRANSCRIPT,
        "stream": stream,
        "seed": seed,
    }
    return request(server.url + "/v1/tts", body)


def _prompt(ctx: Context) -> str:
    return base64.b64encode((ctx.shared / "audio" / "prompt_zh_24k.wav").read_bytes()).decode()


class MemoryTrace:
    """The server's memory every half second: its GPU memory (nvidia-smi) on CUDA, else its RSS."""

    def __init__(self, pid: int, gpu: bool) -> None:
        self.pid, self.gpu = pid, gpu and shutil.which("nvidia-smi") is not None
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            value = self._read()
            if value is not None:
                self.samples.append(value)

    def _read(self) -> int | None:
        if self.gpu:
            query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
            out = subprocess.run(query, capture_output=True, text=True, check=False).stdout
            used = [
                int(line.split(",")[1])
                for line in out.splitlines()
                if line.split(",")[0].strip() == str(self.pid)
            ]
            return used[0] << 20 if used else None
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return None
        return next(
            (int(line.split()[1]) << 10 for line in status.splitlines() if line.startswith("VmRSS")), None
        )

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(5)
        return self.samples


def service_load(ctx: Context) -> dict[str, Any]:
    """Concurrent streaming and one-shot requests through the service, memory tracked."""
    clients, total = ctx.sizes["clients"], ctx.sizes["requests"]
    server = Server(ctx, "load", concurrency=clients)
    try:
        ready = server.wait_ready()
        prompt = _prompt(ctx)
        trace = MemoryTrace(server.process.pid, ctx.cuda)
        started = time.monotonic()
        with ThreadPoolExecutor(clients) as pool:
            results = list(
                pool.map(lambda i: tts(server, prompt, SHORT_TEXT * (1 + i % 3), i % 2 == 0, i), range(total))
            )
        wall = time.monotonic() - started
        samples = trace.stop()
        after, _, _ = request(server.url + "/ready")
    finally:
        server.stop()
    statuses = [status for status, _, _ in results]
    half = max(1, len(samples) // 2)
    found = {
        "requests": total, "clients": clients, "wall_seconds": round(wall, 2),
        "statuses": {str(s): statuses.count(s) for s in set(statuses)},
        "audio_bytes_min": min(len(body) for _, body, _ in results),
        "memory_first_half_peak": max(samples[:half], default=None),
        "memory_second_half_peak": max(samples[half:], default=None),
        "ready_model": ready.get("model"), "ready_after": after,
    }  # fmt: skip
    if statuses.count(200) != total or found["audio_bytes_min"] <= 44 or after != 200:
        raise CheckFailed("requests failed, returned no audio, or /ready dropped", found)
    first, second = found["memory_first_half_peak"], found["memory_second_half_peak"]
    if first is not None and second is not None and second > first * 1.25 + (64 << 20):
        raise CheckFailed("the server's memory kept growing under load", found)
    return found


def out_of_memory(ctx: Context) -> dict[str, Any]:
    """A forced out-of-memory: a 503 out_of_memory with Retry-After, the engine healthy, a restart."""
    wrapper = ["--oom-fraction", "0.5", "--oom-over-tokens", str(OOM_OVER_TOKENS)]
    server = Server(ctx, "oom", wrapper)
    try:
        server.wait_ready()
        prompt = _prompt(ctx)
        found: dict[str, Any] = {"short_before": tts(server, prompt, SHORT_TEXT, False, 1)[0]}
        status, body, headers = tts(server, prompt, LONG_TEXT, False, 2)
        found["long"] = {
            "status": status,
            "body": body[:300].decode(errors="replace"),
            "retry_after": headers.get("Retry-After"),
        }
        found["ready_after_oom"] = request(server.url + "/ready")[0]
        found["short_after"] = tts(server, prompt, SHORT_TEXT, False, 3)[0]
        found["restart"] = request(server.url + "/admin/engine/restart", {})[0]
        found["ready_after_restart"] = server.wait_ready().get("ready")
        found["short_after_restart"] = tts(server, prompt, SHORT_TEXT, True, 4)[0]
    finally:
        server.stop()
    answered = status == 503 and b"out_of_memory" in body and bool(found["long"]["retry_after"])
    recovered = found["ready_after_oom"] == 200 and found["short_after"] == 200
    restarted = found["restart"] == 202 and found["short_after_restart"] == 200
    if not (found["short_before"] == 200 and answered and recovered and restarted):
        raise CheckFailed(
            "out of memory was not answered as a 503 out_of_memory, or the engine did not recover", found
        )
    return found


def serve_wrapped(argv: list[str]) -> int:
    """`--serve [--oom-fraction F --oom-over-tokens N] -- serve ...`: run `cosyserve serve`, with the
    forced out-of-memory hook installed when asked."""
    split = argv.index("--")
    options, serve = argv[:split], argv[split + 1 :]
    if "--oom-fraction" in options:
        fraction = float(options[options.index("--oom-fraction") + 1])
        over = int(options[options.index("--oom-over-tokens") + 1])
        _install_oom(fraction, over, serve[serve.index("--device") + 1])
    from cosyserve.cli import main

    return main(serve)


def _install_oom(fraction: float, over_tokens: int, device: str) -> None:
    import torch

    from cosyserve.engine.token2wav import Token2Wav

    torch.cuda.set_per_process_memory_fraction(fraction, torch.device(device))
    original = Token2Wav._flow

    def flow(
        self: Token2Wav, tokens: torch.Tensor, prompt: Any, *, streaming: bool, finalize: bool
    ) -> torch.Tensor:
        if tokens.shape[1] >= over_tokens:  # past the cap: the caching allocator raises OutOfMemoryError
            total = torch.cuda.get_device_properties(torch.device(device)).total_memory
            torch.empty(int(total * (fraction + 0.1)), dtype=torch.uint8, device=device)
        return original(self, tokens, prompt, streaming=streaming, finalize=finalize)

    Token2Wav._flow = flow  # type: ignore[method-assign]


if __name__ == "__main__" and sys.argv[1:2] == ["--serve"]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    sys.exit(serve_wrapped(sys.argv[2:]))
