"""Load benchmark: does an interactive request wait behind another key's batch or long job?

Starts the app in this process around the demo model (random weights: the timings are the scheduler's,
not the model's quality), with API keys on, and prints:

- interactive /v1/tts latency p50/p95 alone, and while another key's batch of `--items` runs;
- the batch's throughput alone and shared;
- /v1/tts latency while another key's `--job-chars`-character job runs, and how fast a cancel frees it;
- queued jobs' estimated wait (status API) against the wait they had, and Retry-After against the time
  until the full queue had room again.

    PYTHONPATH=src python scripts/load_bench.py --prompt prompt.wav [--items 200] [--job-chars 10000]

Not a test: figures depend on the machine. It only uses the HTTP API and `scheduler.stats()`, so it runs
against older versions of the service too.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from cosyserve.api.app import create_app
from cosyserve.modeldir.demo_model import write_demo_model
from cosyserve.service.assembly import Service
from cosyserve.service.settings import Settings

TEXT = "你好。"  # one short sentence: one unit
TRANSCRIPT = "希望你以后能够做的比我还好呦。"
TERMINAL = {"done", "failed", "cancelled"}


def start_server(data_dir: Path, model: Path, concurrency: int | None) -> tuple[Service, str, Any]:
    settings: dict[str, Any] = {
        "model": str(model),
        "device": "cpu",
        "data_dir": str(data_dir),
        "queue_size": 64,
        "request_timeout_s": 600.0,
        "api_keys_required": True,
        "rate_limit_per_minute": 0,
        "signing_secret": "bench-signing-secret-0123456789abcdef",
    }
    if concurrency:
        settings["concurrency"] = concurrency
    service = Service(Settings(**settings))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(create_app(service), log_config=None, access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    deadline = time.monotonic() + 300
    while not (server.started and service.readiness()["ready"]):
        if time.monotonic() > deadline:
            raise SystemExit("the server did not become ready")
        time.sleep(0.1)
    return service, f"http://127.0.0.1:{sock.getsockname()[1]}", server


def client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=900)


def tts_latency(http: httpx.Client) -> float:
    began = time.monotonic()
    response = http.post("/v1/tts", json={"text": TEXT, "voice": "bench", "seed": 1})
    if response.status_code != 200:
        raise SystemExit(f"/v1/tts answered {response.status_code}: {response.text}")
    return time.monotonic() - began


def percentiles(values: list[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"p50 {statistics.median(ordered):6.2f} s  p95 {p95:6.2f} s  (n={len(ordered)})"


def wait_state(http: httpx.Client, path: str, states: set[str], timeout: float = 3600) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = http.get(path).json()
        if body["state"] in states or time.monotonic() > deadline:
            return body
        time.sleep(0.1)


def run_batch(http: httpx.Client, items: int) -> str:
    body = {"voice": "bench", "seed": 2, "items": [f"第{i}句。" for i in range(items)]}
    response = http.post("/v1/batches", json=body)
    if response.status_code != 202:
        raise SystemExit(f"/v1/batches answered {response.status_code}: {response.text}")
    return f"/v1/batches/{response.json()['id']}"


def while_running(http_b: httpx.Client, http_a: httpx.Client, path: str, limit: int) -> list[float]:
    """/v1/tts latencies from key B, one after another, while A's work at `path` runs."""
    wait_state(http_a, path, {"running", *TERMINAL})
    latencies = []
    while len(latencies) < limit and http_a.get(path).json()["state"] not in TERMINAL:
        latencies.append(tts_latency(http_b))
    return latencies


def estimate_accuracy(service: Service, http: dict[str, httpx.Client], items: int) -> list[str]:
    """Jobs from three keys queued behind a batch: estimated wait at submit against the real one."""
    lines = []
    batch = run_batch(http["A"], items)
    wait_state(http["A"], batch, {"running", *TERMINAL})
    submitted = []
    for name in ("B", "C", "B", "C"):
        began = time.monotonic()
        body = http[name].post("/v1/jobs", json={"text": TEXT * 3, "voice": "bench"}).json()
        submitted.append((name, body["id"], began, body.get("estimated_wait_s")))
    for name, job_id, began, estimate in submitted:
        record = wait_state(http[name], f"/v1/jobs/{job_id}", {"running", *TERMINAL})
        actual = time.monotonic() - began
        lines.append(f"  job of key {name}: estimated {estimate} s, started after {actual:.2f} s")
        wait_state(http[name], f"/v1/jobs/{job_id}", TERMINAL)
        del record
    http["A"].delete(batch)
    wait_state(http["A"], batch, TERMINAL)
    # Retry-After: a full queue (made small), then the time until it has room again
    scheduler = service.scheduler
    saved, scheduler.queue_size = scheduler.queue_size, 2
    refused: list[tuple[float, float]] = []
    threads = []

    def one() -> None:
        response = http["B"].post("/v1/tts", json={"text": TEXT, "voice": "bench"})
        if response.status_code == 429:
            refused.append((time.monotonic(), float(response.headers.get("retry-after", "nan"))))

    for _ in range(6):
        threads.append(threading.Thread(target=one))
        threads[-1].start()
        time.sleep(0.05)
    while not refused and any(t.is_alive() for t in threads):
        time.sleep(0.01)
    if refused:
        at, retry = refused[0]
        capacity = scheduler.queue_size
        while scheduler.stats()["queued"] >= capacity:
            time.sleep(0.02)
        lines.append(f"  Retry-After {retry:.0f} s; the queue had room after {time.monotonic() - at:.2f} s")
    else:
        lines.append("  no 429 came (the queue never filled)")
    for thread in threads:
        thread.join()
    scheduler.queue_size = saved
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_prompt = Path(os.environ.get("COSYSERVE_SHARED", "../shared")) / "audio" / "prompt_zh_24k.wav"
    parser.add_argument("--prompt", type=Path, default=default_prompt, help="a speech recording (>= 3 s)")
    parser.add_argument("--items", type=int, default=200, help="items of the other key's batch")
    parser.add_argument("--job-chars", type=int, default=10000, help="characters of the other key's job")
    parser.add_argument("--repeats", type=int, default=10, help="interactive requests per measurement")
    parser.add_argument("--concurrency", type=int, default=None, help="engine slots (default: the server's)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model = write_demo_model(Path(tmp) / "demo", seed=0)
        service, url, server = start_server(Path(tmp) / "data", model, args.concurrency)
        keys = {name: service.keys.create(f"bench-{name}", "user")[1] for name in "ABC"}
        admin = service.keys.create("bench-admin", "admin")[1]
        with client(url, admin) as http_admin:
            files = {"audio": ("prompt.wav", args.prompt.read_bytes(), "audio/wav")}
            fields = {"name": "bench", "transcript": TRANSCRIPT, "consent": "true", "shared": "true"}
            enrolled = http_admin.post("/v1/voices", data=fields, files=files)
            if enrolled.status_code != 201:
                raise SystemExit(f"enrolling the voice failed: {enrolled.text}")
        http = {name: client(url, key) for name, key in keys.items()}
        print(f"scheduler: {service.scheduler.stats()['concurrency']} slot(s); batch of {args.items} items")
        tts_latency(http["B"])  # warm-up
        alone = [tts_latency(http["B"]) for _ in range(args.repeats)]
        print(f"/v1/tts alone:                 {percentiles(alone)}")

        began = time.monotonic()
        batch = run_batch(http["A"], args.items)
        wait_state(http["A"], batch, TERMINAL)
        batch_alone = time.monotonic() - began
        print(f"batch alone:                   {batch_alone:7.1f} s ({args.items / batch_alone:.2f} items/s)")

        began = time.monotonic()
        batch = run_batch(http["A"], args.items)
        shared = while_running(http["B"], http["A"], batch, args.repeats)
        wait_state(http["A"], batch, TERMINAL)
        batch_shared = time.monotonic() - began
        print(f"/v1/tts under the batch:       {percentiles(shared)}")
        print(
            f"batch shared:                  {batch_shared:7.1f} s ({args.items / batch_shared:.2f} items/s)"
        )

        text = ("这是一个很长的句子，用来测试长文本任务。" * (args.job_chars // 19 + 1))[: args.job_chars]
        job = http["A"].post("/v1/jobs", json={"text": text, "voice": "bench"}).json()
        path = f"/v1/jobs/{job['id']}"
        under_job = while_running(http["B"], http["A"], path, min(args.repeats, 5))
        print(f"/v1/tts under a {args.job_chars}-char job: {percentiles(under_job)}")
        began = time.monotonic()
        http["A"].delete(path)
        ended = wait_state(http["A"], path, TERMINAL)
        print(f"cancelling the job:            {ended['state']} after {time.monotonic() - began:.2f} s")

        print("waits told against waits had:")
        for line in estimate_accuracy(service, http, args.items):
            print(line)
        for each in http.values():
            each.close()
        server.should_exit = True


if __name__ == "__main__":
    main()
