"""S3 sync from the running service, against moto's S3 server on 127.0.0.1."""

from __future__ import annotations

import json
import time

import boto3
import pytest
from tests.conftest import API_SEED, API_TEXT, enrol_voice

moto_server = pytest.importorskip("moto.server")
BUCKET = "cosyserve-outputs"


@pytest.fixture(scope="module")
def endpoint():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                      aws_access_key_id="test", aws_secret_access_key="test")  # fmt: skip
    s3.create_bucket(Bucket=BUCKET)
    yield url, s3
    server.stop()
    server._server.server_close()


def test_outputs_are_uploaded_with_their_manifest(start_api_server, endpoint, prompt_wav_bytes) -> None:
    url, s3 = endpoint
    live = start_api_server(
        s3_sync=True,
        s3_endpoint_url=url,
        s3_bucket=BUCKET,
        s3_prefix="node-1",
        s3_region="us-east-1",
        s3_access_key_id="test",
        s3_secret_access_key="test",
        s3_lifecycle_days=30,
    )
    try:
        with live.client() as client:
            enrol_voice(client, "alice", prompt_wav_bytes)
            response = client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", "seed": API_SEED})
            assert response.status_code == 200
            output_id = response.headers["x-cosyserve-output-id"]
            assert live.service.s3.flush(timeout=30)
            keys = {item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET, Prefix="node-1/")["Contents"]}
            assert {f"node-1/{output_id}.wav", f"node-1/{output_id}.json"} <= keys
            audio = s3.get_object(Bucket=BUCKET, Key=f"node-1/{output_id}.wav")["Body"].read()
            assert audio == response.content
            manifest = json.loads(s3.get_object(Bucket=BUCKET, Key=f"node-1/{output_id}.json")["Body"].read())
            assert manifest["seed"] == API_SEED
            rules = s3.get_bucket_lifecycle_configuration(Bucket=BUCKET)["Rules"]
            assert any(rule["Expiration"]["Days"] == 30 for rule in rules)
            status = client.get("/admin/status").json()["s3"]
            assert status["uploaded"] >= 2 and status["failed"] == 0
    finally:
        live.stop()


def test_an_unreachable_bucket_does_not_stop_the_service(start_api_server, prompt_wav_bytes) -> None:
    live = start_api_server(
        s3_sync=True,
        s3_endpoint_url="http://127.0.0.1:9",
        s3_bucket="nowhere",
        s3_access_key_id="x",
        s3_secret_access_key="y",
        s3_region="us-east-1",
    )
    live.service.s3.max_attempts = 1
    try:
        with live.client() as client:
            enrol_voice(client, "alice", prompt_wav_bytes)
            response = client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", "seed": API_SEED})
            assert response.status_code == 200  # the audio is served; the failed upload is logged
            deadline = time.monotonic() + 60
            while live.service.s3.failed_count < 1:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            logs = client.get("/admin/logs", params={"level": "ERROR", "limit": 1000}).json()["data"]
            assert any("failed for good" in entry["message"] for entry in logs)
            failed = live.service.s3.failed
            assert [f.key.rsplit(".", 1)[1] for f in failed] == ["wav"]  # no sidecar without its audio
            # visible without reading logs: /ready (still ready: results are kept here) and /metrics
            sync = client.get("/ready").json()["s3_sync"]
            assert sync["ok"] is False and sync["failing"] == 1
            assert "last_error" not in sync  # it names the endpoint, bucket and objects: for admins
            detailed = client.get("/admin/status").json()["readiness"]["s3_sync"]
            assert "Could not connect" in detailed["last_error"]
            assert "cosyserve_s3_failing 1.0" in client.get("/metrics").text
    finally:
        live.stop()
