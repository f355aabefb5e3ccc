"""Distributed mode end to end, with real servers: one API node and two workers as separate processes on
the demo model, sharing redis-server (queue and relay), PostgreSQL (jobs, voices, keys) and an S3 bucket
(moto's server; each node has its own data directory). A worker is killed mid-job: every job still ends
done exactly once, with one output. The API node is restarted with jobs in flight: they finish anyway."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from cosyserve.service.labels import riff_tags
from cosyserve.service.stores.db import make_engine
from cosyserve.service.stores.jobs import JobStore

pytestmark = pytest.mark.slow
moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

BUCKET = "cosyserve-cluster"
LEASE_S = 2.0
VISIBILITY_S = 5.0
LONG_TEXT = "今天天气很好，我们一起去公园散步吧。" * 8  # 4 pieces of at most 40 characters: seen under way
# after one, with three left for a kill, a cancel or a revoked key to land in the middle of the job
BATCH_ITEMS = 6  # a worker is stopped at 2 items done (progress >= 0.2) with 4 items left
BATCH_LINES = "\n".join(f"第{n}句，稍微长一点的一句话。" for n in range(1, BATCH_ITEMS + 1)).encode()
# Batches that must still run after a short request took its turn; cancelled then, so their length is free
# (24 items were once all done on one worker before the restarted one had finished its first).
BUSY_ITEMS = 100
BUSY_LINES = "\n".join(f"第{n}句，稍微长一点的一句话。" for n in range(1, BUSY_ITEMS + 1)).encode()
PROMPT_TEXT = "希望你以后能够做的比我还好呦。"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Node:
    """One `cosyserve` process with its log in a file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name, self.args, self.env = name, args, env
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Node:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cosyserve.cli", *self.args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        self.send(sig)
        self.wait(timeout)

    def send(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    def wait(self, timeout: float) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""


class Cluster:
    def __init__(self, nodes: dict[str, Node], api_url: str, jobs: JobStore, s3_client) -> None:
        self.nodes, self.api_url, self.jobs, self.s3 = nodes, api_url, jobs, s3_client
        self.worker_urls: dict[str, str] = {}
        self.queue_url = ""
        self.base = Path()  # each node's data directory is base / its name
        self.http = httpx.Client(base_url=api_url, timeout=120.0)

    def wait_ready(self, workers: int, timeout: float = 180.0) -> dict:
        deadline = time.monotonic() + timeout
        body: dict = {}
        while time.monotonic() < deadline:
            try:
                body = self.http.get("/ready").json()
                if body.get("ready") and body.get("workers") == workers:
                    return body
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"not ready with {workers} workers: {body}\n{self.logs()}")

    def wait_jobs(self, job_ids: list[str], timeout: float = 240.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            records = {job_id: self.jobs.get(job_id) for job_id in job_ids}
            if all(record is not None and record.is_terminal for record in records.values()):
                return records
            time.sleep(0.3)
        raise AssertionError(f"jobs did not finish: {records}\n{self.logs()}")

    def submit_job(self, voice: str) -> str:
        response = self.http.post("/v1/jobs", json={"text": LONG_TEXT, "voice": voice})
        assert response.status_code in (200, 201, 202), response.text
        return response.json()["id"]

    def bucket_outputs(self) -> list[str]:
        listing = self.s3.list_objects_v2(Bucket=BUCKET)
        return sorted(o["Key"] for o in listing.get("Contents", []) if o["Key"].endswith(".json"))

    def lose_delivered_messages(self) -> None:
        """Drop every message a worker took and has not acknowledged (kombu's record of them)."""
        import redis

        client = redis.Redis.from_url(self.queue_url)
        try:
            client.delete("unacked", "unacked_index")
        finally:
            client.close()

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{node.log_tail()}" for name, node in self.nodes.items())


def _own_database(postgres_url: str) -> str:
    """A fresh database on the test PostgreSQL server, so other tests' rows never mix with the cluster's."""
    import sqlalchemy as sa

    name = f"cluster_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    admin.dispose()
    return str(sa.engine.make_url(postgres_url).set(database=name).render_as_string(hide_password=False))


@pytest.fixture(scope="module")
def cluster(redis_url, postgres_url, demo_model_path, tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster")
    postgres_url = _own_database(postgres_url)
    s3_server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    s3_server.start()
    endpoint = f"http://127.0.0.1:{s3_server._server.server_port}"
    credentials = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    s3.create_bucket(Bucket=BUCKET)
    env = {
        **os.environ,
        **credentials,
        "COSYSERVE_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("CI", None)  # the nodes are not tests
    queue = redis_url.rsplit("/", 1)[0] + "/1"  # a database of its own on the shared test redis
    common = [
        "--queue", queue, "--model", str(demo_model_path), "--device", "cpu", "--database-url", postgres_url,
        "--job-lease-s", str(LEASE_S), "--visibility-timeout-s", str(VISIBILITY_S), "--max-text-chars", "40",
        "--s3-sync", "--s3-bucket", BUCKET, "--s3-endpoint-url", endpoint, "--s3-region", "us-east-1",
    ]  # fmt: skip
    port = _free_port()

    def node(name: str, command: str, *extra: str) -> Node:
        return Node(name, [command, *common, "--data-dir", str(base / name), *extra], env, base)

    worker = ("--concurrency", "1", "--name")
    worker_ports = {"wA": _free_port(), "wB": _free_port()}
    nodes = {
        "api": node("api", "serve", "--port", str(port)),
        "wA": node("wA", "worker", *worker, "wA", "--port", str(worker_ports["wA"])),
        "wB": node("wB", "worker", *worker, "wB", "--port", str(worker_ports["wB"])),
    }
    for node in nodes.values():
        node.start()
    engine = make_engine(postgres_url)
    running = Cluster(nodes, f"http://127.0.0.1:{port}", JobStore(engine), s3)
    running.queue_url = queue
    running.base = base
    running.worker_urls = {name: f"http://127.0.0.1:{p}" for name, p in worker_ports.items()}
    try:
        running.wait_ready(workers=2)
        yield running
    finally:
        for node in nodes.values():  # all at once: each takes a second or two to stop
            node.send(signal.SIGTERM)
        for node in nodes.values():
            node.wait(30.0)
        running.http.close()
        engine.dispose()
        s3_server.stop()


@pytest.fixture(scope="module")
def voice(cluster: Cluster, prompt_wav_bytes: bytes) -> str:
    """A voice enrolled through the API node (on whichever worker took it)."""
    response = cluster.http.post(
        "/v1/voices",
        data={"name": "cluster-voice", "transcript": PROMPT_TEXT},
        files={"audio": ("prompt.wav", prompt_wav_bytes, "audio/wav")},
    )
    assert response.status_code in (200, 201), response.text
    return response.json()["id"]


def test_interactive_requests_run_on_workers_and_results_reach_the_api_node(
    cluster: Cluster, voice: str
) -> None:
    body = cluster.wait_ready(workers=2)
    assert body["role"] == "api" and body["demo"] is True and body["sample_rate"] == 24000
    # Both workers take requests: each synthesises with the voice the other (or itself) enrolled.
    outputs = []
    for _ in range(4):
        response = cluster.http.post("/v1/tts", json={"text": "你好，世界。", "voice": voice, "seed": 3})
        assert response.status_code == 200, response.text
        assert response.content[:4] == b"RIFF"
        outputs.append(response)
    samples = {riff_tags.payload(r.content) for r in outputs}  # each file's label names its own output
    assert len(samples) == 1  # same seed, same audio, whichever worker ran it
    # The result was stored by a worker; the API node serves it from the bucket.
    output_id = outputs[0].headers["x-cosyserve-output-id"]
    stored = cluster.http.get(f"/v1/outputs/{output_id}")
    assert stored.status_code == 200 and stored.content == outputs[0].content

    # Deleted through the API node, it leaves no copy on the worker that made it either.
    def copies() -> list[Path]:  # the output's files (a tombstone `.gone` only holds its id)
        found = [p for name in cluster.worker_urls for p in (cluster.base / name).rglob(f"{output_id}.*")]
        return [p for p in found if p.suffix != ".gone"]

    assert copies()
    assert cluster.http.delete(f"/v1/outputs/{output_id}").status_code == 204
    deadline = time.monotonic() + 3 * LEASE_S + 5  # a heartbeat or two
    while copies() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not copies(), copies()
    # Streaming crosses the nodes chunk by chunk.
    with cluster.http.stream(
        "POST", "/v1/tts", json={"text": "你好。", "voice": voice, "stream": True}
    ) as stream:
        assert stream.status_code == 200
        chunks = [chunk for chunk in stream.iter_bytes() if chunk]
    assert b"".join(chunks)[:4] == b"RIFF"
    # Each worker reports its own readiness and the speed metrics of the syntheses it ran.
    audio_seconds = 0.0
    for name, url in cluster.worker_urls.items():
        ready = httpx.get(f"{url}/ready", timeout=10).json()
        assert ready["ready"] and ready["role"] == "worker" and ready["name"] == name
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        audio_seconds += sum(
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("cosyserve_audio_seconds_total")
        )
    assert audio_seconds > 0
    # Errors raised on a worker arrive as the same API errors.
    missing = cluster.http.post("/v1/tts", json={"text": "你好。", "voice": "no-such-voice"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "voice_not_found"


def test_a_worker_killed_mid_job_loses_no_job_and_duplicates_none(cluster: Cluster, voice: str) -> None:
    before = set(cluster.bucket_outputs())
    job_ids = [cluster.submit_job(voice) for _ in range(4)]
    # Wait until worker A is well into one of them, then kill it without warning.
    deadline = time.monotonic() + 120
    victim = None
    while victim is None:
        assert time.monotonic() < deadline, cluster.logs()
        for job_id in job_ids:
            record = cluster.jobs.get(job_id)
            if record.state == "running" and record.worker == "wA" and record.progress > 0.1:
                victim = job_id
        time.sleep(0.1)
    cluster.nodes["wA"].stop(signal.SIGKILL)

    records = cluster.wait_jobs(job_ids)
    assert {job_id: r.state for job_id, r in records.items()} == dict.fromkeys(job_ids, "done"), (
        cluster.logs()
    )
    assert records[victim].attempt >= 2 and records[victim].worker == "wB"
    # One result per job: distinct outputs, and the bucket gained exactly those.
    output_ids = [r.output_id for r in records.values()]
    assert len(set(output_ids)) == len(job_ids)
    new = set(cluster.bucket_outputs()) - before
    assert sorted(new) == sorted(f"{output_id}.json" for output_id in output_ids)
    for job_id in job_ids:
        view = cluster.http.get(f"/v1/jobs/{job_id}").json()
        assert view["state"] == "done" and view["result_url"]
        assert cluster.http.get(view["result_url"]).content[:4] == b"RIFF"
    # A new worker joins and the lost one is gone from readiness.
    cluster.nodes["wA"].start()
    cluster.wait_ready(workers=2)


def test_jobs_survive_an_api_node_restart_and_cancel_reaches_the_worker(cluster: Cluster, voice: str) -> None:
    job_ids = [cluster.submit_job(voice) for _ in range(2)]
    cluster.nodes["api"].stop(signal.SIGTERM)
    cluster.nodes["api"].start()
    cluster.wait_ready(workers=2)
    records = cluster.wait_jobs(job_ids)
    assert all(r.state == "done" for r in records.values()), cluster.logs()

    victim = cluster.submit_job(voice)
    deadline = time.monotonic() + 60
    while cluster.jobs.get(victim).state != "running":
        assert time.monotonic() < deadline, cluster.logs()
        time.sleep(0.1)
    cancelled = cluster.http.delete(f"/v1/jobs/{victim}")
    assert cancelled.status_code == 202 and cancelled.json()["state"] == "cancelled"
    time.sleep(LEASE_S * 2)  # the worker notices, stops, and records nothing
    record = cluster.jobs.get(victim)
    assert record.state == "cancelled" and record.output_id is None
    # Both workers are free again: a short request is answered.
    response = cluster.http.post("/v1/tts", json={"text": "好。", "voice": voice})
    assert response.status_code == 200


def test_batches_and_dubs_run_on_the_workers(cluster: Cluster, voice: str) -> None:
    """A batch and a dub sent to the API node run on the workers; a worker killed mid-batch hands it to
    the other, which goes on at the first unfinished item (every item made once); a cancel stops one."""
    before = set(cluster.bucket_outputs())
    plain = {"content-type": "text/plain"}
    lines = BATCH_LINES
    batch = cluster.http.post("/v1/batches", content=lines, params={"voice": voice}, headers=plain).json()
    srt = "".join(f"{n}\n00:00:0{2 * n - 1},000 --> 00:00:0{2 * n},500\n第{n}句。\n\n" for n in range(1, 4))
    dub = cluster.http.post("/v1/dub", data={"voice": voice}, files={"file": ("a.srt", srt.encode())}).json()
    deadline = time.monotonic() + 120
    while (record := cluster.jobs.get(batch["id"])).state != "running" or record.progress < 0.2:
        assert time.monotonic() < deadline, cluster.logs()
        time.sleep(0.1)
    holder = record.worker
    cluster.nodes[holder].stop(signal.SIGKILL)
    # Its late-acked message is lost too (Redis restarted without persistence; kombu once dropped it):
    # another worker goes on with the batch all the same, from the jobs table (`lost_jobs.py`).
    cluster.lose_delivered_messages()
    records = cluster.wait_jobs([batch["id"], dub["id"]], timeout=300)
    assert records[batch["id"]].state == "done" and records[batch["id"]].attempt >= 2, cluster.logs()
    view = cluster.http.get(f"/v1/batches/{batch['id']}", params={"limit": 100}).json()
    assert view["done"] == BATCH_ITEMS and len({item["output_id"] for item in view["items"]}) == BATCH_ITEMS
    track = cluster.http.get(f"/v1/dub/{dub['id']}").json()
    assert track["state"] == "done" and track["done"] == 3, track
    new = set(cluster.bucket_outputs()) - before  # every item once, plus the dub's cues and its track
    made = {f"{item['output_id']}.json" for item in view["items"]} | {f"{records[dub['id']].output_id}.json"}
    made |= {f"{item['output_id']}.json" for item in track["items"]}
    assert new == made
    archive = cluster.http.get(view["archive_url"])  # read through the bucket by the API node
    assert archive.status_code == 200 and archive.content[:2] == b"PK"
    cluster.nodes[holder].start()
    cluster.wait_ready(workers=2)

    busy = BUSY_LINES
    victim = cluster.http.post("/v1/batches", content=busy, params={"voice": voice}, headers=plain).json()
    other = cluster.http.post("/v1/batches", content=busy, params={"voice": voice}, headers=plain).json()
    while min(cluster.http.get(f"/v1/batches/{b['id']}").json()["done"] for b in (victim, other)) < 1:
        assert time.monotonic() < deadline + 300, cluster.logs()
        time.sleep(0.1)
    # Both workers run a batch: a short request still takes its turn between two items, not after them.
    asked = time.monotonic()
    assert cluster.http.post("/v1/tts", json={"text": "好。", "voice": voice}).status_code == 200
    tts_s = time.monotonic() - asked
    views = {b["id"]: cluster.http.get(f"/v1/batches/{b['id']}").json() for b in (victim, other)}
    # It answered while a batch still ran (a batch of 100 items outlasts it many times over). Both are
    # usually still running; once, on a loaded CI machine, one had ended: what each did is in the message.
    summary = [{k: view.get(k) for k in ("state", "done", "failed", "cancelled")} for view in views.values()]
    running = [batch_id for batch_id, view in views.items() if view["state"] == "running"]
    assert running, (summary, tts_s)
    for batch_id in running:  # a running batch's cancel stops it at the next item; the rest end cancelled
        assert cluster.http.delete(f"/v1/batches/{batch_id}").status_code == 202
    time.sleep(LEASE_S * 2)  # the worker notices and stops
    ended = cluster.http.get(f"/v1/batches/{running[0]}", params={"limit": 100}).json()
    assert ended["state"] == "cancelled" and ended["done"] + ended["cancelled"] == BUSY_ITEMS, ended
    time.sleep(LEASE_S)
    assert cluster.http.get(f"/v1/batches/{running[0]}").json()["done"] == ended["done"]


def test_a_worker_stopped_with_sigterm_gives_its_running_batch_back_at_once(
    cluster: Cluster, voice: str
) -> None:
    """SIGTERM on a worker: its running batch goes back to the queue at once (not failed, not held until it
    ends) and the other worker goes on after its finished items."""
    plain = {"content-type": "text/plain"}
    lines = BATCH_LINES
    batch = cluster.http.post("/v1/batches", content=lines, params={"voice": voice}, headers=plain).json()
    deadline = time.monotonic() + 120
    while (record := cluster.jobs.get(batch["id"])).state != "running" or record.progress < 0.2:
        assert time.monotonic() < deadline, cluster.logs()
        time.sleep(0.1)
    holder = record.worker
    done_before = {
        item["position"]: item["output_id"]
        for item in cluster.http.get(f"/v1/batches/{batch['id']}", params={"limit": 100}).json()["items"]
        if item["state"] == "done"
    }
    node = cluster.nodes[holder]
    node.stop(signal.SIGTERM, timeout=60)
    assert node.process is not None and node.process.returncode is not None, cluster.logs()
    record = cluster.wait_jobs([batch["id"]], timeout=300)[batch["id"]]
    assert record.state == "done" and record.attempt >= 2 and record.worker != holder, cluster.logs()
    view = cluster.http.get(f"/v1/batches/{batch['id']}", params={"limit": 100}).json()
    assert view["done"] == BATCH_ITEMS and view["failed"] == 0
    after = {item["position"]: item["output_id"] for item in view["items"]}
    assert all(after[position] == output_id for position, output_id in done_before.items())  # not made twice
    node.start()
    cluster.wait_ready(workers=2)


def test_a_revoked_keys_job_stops_on_its_worker(cluster: Cluster, voice: str) -> None:
    """Last in this module: its keys turn authentication on. The worker re-reads the key in the shared
    database at every segment: a key revoked on the API node stops its job there, charged only for what
    came before, and the finished part is kept."""
    import sqlalchemy as sa

    from cosyserve.service.access.limits import QuotaTracker
    from cosyserve.service.stores.keys import KeyStore

    keys = KeyStore(cluster.jobs.engine, sa.MetaData())
    admin = {"Authorization": f"Bearer {keys.create('cluster-ops', 'admin')[1]}"}
    key, secret = keys.create("cluster-app", "user")
    user = {"Authorization": f"Bearer {secret}"}
    deadline = time.monotonic() + 30
    while (
        job := cluster.http.post("/v1/jobs", json={"text": LONG_TEXT, "voice": voice}, headers=user)
    ).status_code == 401:
        assert time.monotonic() < deadline  # the API node sees the first key within its 2 s cache
        time.sleep(0.3)
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]
    deadline = time.monotonic() + 120
    while (record := cluster.jobs.get(job_id)).state != "running" or record.progress <= 0.05:
        assert time.monotonic() < deadline and not record.is_terminal, cluster.logs()
        time.sleep(0.1)
    assert cluster.http.post(f"/admin/keys/{key.id}/revoke", headers=admin).status_code == 200
    record = cluster.wait_jobs([job_id])[job_id]
    assert (record.state, record.error_code) == ("failed", "key_revoked"), cluster.logs()
    partial = record.result_extra["partial"]
    assert 1 <= partial["segments_done"] < partial["segments_total"] and record.output_id
    used = QuotaTracker(cluster.jobs.engine, sa.MetaData()).used(key.id)
    assert used == pytest.approx(partial["audio_s"], abs=0.01)
    view = cluster.http.get(f"/v1/jobs/{job_id}", headers=admin).json()
    assert view["partial"]["segments_done"] == partial["segments_done"]
    assert cluster.http.get(view["result_url"]).content[:4] == b"RIFF"


def test_concurrent_requests_on_the_cluster_stay_within_the_quota(cluster: Cluster, voice: str) -> None:
    """Issue 25 on a cluster: 10 concurrent requests of one key with a 10 s quota, through the API node to
    the workers. The API node reserves each estimate in the shared database before it sends a task, the
    worker settles it: the key is charged at most its quota plus one request's length (authentication is
    on here: the test before this one made keys)."""
    import threading

    import sqlalchemy as sa

    from cosyserve.service.access.limits import QuotaTracker
    from cosyserve.service.stores.keys import KeyStore

    keys = KeyStore(cluster.jobs.engine, sa.MetaData())
    key, secret = keys.create("cluster-burst", "user", quota=10.0)
    headers = {"Authorization": f"Bearer {secret}"}
    barrier, answers = threading.Barrier(10), []

    def request() -> None:
        barrier.wait()
        body = {"text": "第一句话说得很长很长。", "voice": voice, "seed": 4}
        answers.append(cluster.http.post("/v1/tts", json=body, headers=headers, timeout=300))

    threads = [threading.Thread(target=request) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    made = [float(a.headers["x-cosyserve-duration"]) for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code != 200]
    assert made and refused, [a.status_code for a in answers]
    assert {a.json()["error"]["code"] for a in refused} == {"quota_exceeded"}, [a.text for a in refused]
    used = QuotaTracker(cluster.jobs.engine, sa.MetaData()).used(key.id)
    assert used == pytest.approx(sum(made), abs=0.01)  # what the workers made, settled once each
    assert used <= 10.0 + max(made)
