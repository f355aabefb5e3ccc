"""Probes, metrics, docs, CORS and the admin endpoints: health before the model, ready after, restart."""

from __future__ import annotations

import base64
import re
import threading
import time

import pytest
from tests.conftest import API_SEED, API_TEXT, PROMPT_TRANSCRIPT, enrol_voice, sharing


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def gated(start_api_server, api_synthesizer):
    """A server whose model loads only when the test opens `gate` (and counts its loads)."""
    gate, loads = threading.Event(), []

    def factory(settings, voices):
        gate.wait(60)
        loads.append(time.monotonic())
        return sharing(api_synthesizer)(settings, voices)

    live = start_api_server(factory=factory, wait_ready=False)
    live.gate, live.loads = gate, loads
    yield live
    gate.set()
    live.stop()


def test_health_answers_before_the_model_is_loaded_and_ready_follows(gated) -> None:
    with gated.client() as client:
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert health.json()["model_state"] == "loading"
        assert re.fullmatch(r"[0-9a-f]{12}", health.json()["source"])  # which code exactly (build_info)
        ready = client.get("/ready")
        assert ready.status_code == 503 and ready.headers["retry-after"] == "5"
        assert ready.json()["error"]["code"] == "not_ready" and "loading" in ready.json()["error"]["message"]
        busy = client.post("/v1/tts", json={"text": API_TEXT, "voice": "x"})
        assert busy.status_code == 503 and busy.json()["error"]["code"] == "model_not_ready"
        assert "retry-after" in busy.headers
        gated.gate.set()
        wait_for(lambda: client.get("/ready").status_code == 200)
        body = client.get("/ready").json()
        assert body["ready"] is True and body["demo"] is True and body["device"] == "cpu"


def test_restart_reloads_the_model(gated, prompt_wav_bytes) -> None:
    gated.gate.set()
    with gated.client() as client:
        wait_for(lambda: client.get("/ready").status_code == 200)
        enrol_voice(client, "alice", prompt_wav_bytes)
        loads = len(gated.loads)
        restart = client.post("/admin/engine/restart")
        assert restart.status_code == 202 and restart.json()["state"] in ("restarting", "loading")
        # Work submitted during the reload waits for the new model instead of failing.
        spoken = client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", "seed": API_SEED})
        assert spoken.status_code == 200, spoken.text
        wait_for(lambda: client.get("/ready").status_code == 200)
        assert len(gated.loads) == loads + 1


def test_failed_load_is_reported(start_api_server) -> None:
    def broken(settings, voices):
        raise RuntimeError("no weights here")

    live = start_api_server(factory=broken, wait_ready=False)
    try:
        with live.client() as client:
            wait_for(lambda: live.service.model_state == "failed")
            ready = client.get("/ready")
            assert ready.status_code == 503 and "no weights here" in ready.json()["error"]["message"]
            tts = client.post("/v1/tts", json={"text": "hi", "voice": "x"})
            assert tts.status_code == 503 and tts.json()["error"]["code"] == "model_not_ready"
    finally:
        live.stop()


@pytest.fixture(scope="module")
def server(start_api_server):
    live = start_api_server(cors_origins="https://ui.example")
    yield live
    live.stop()


def test_metrics_are_all_cosyserve_and_count_requests(server) -> None:
    with server.client() as client:
        client.get("/v1/voices")
        client.get("/v1/voices/nobody")
        text = client.get("/metrics").text
    names = {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")
    }
    assert names and all(name.startswith("cosyserve_") for name in names), names
    assert 'cosyserve_requests_total{route="/v1/voices",status="200"}' in text
    assert 'cosyserve_requests_total{route="/v1/voices/{voice_id}",status="404"}' in text
    for family in (
        "queue_depth",
        "in_flight",
        "model_loaded",
        "errors_total",
        "process_resident_memory_bytes",
    ):
        assert f"cosyserve_{family}" in text


def test_admin_logs_status_and_request_ids(server) -> None:
    with server.client() as client:
        marker = client.get("/v1/voices", headers={"X-Request-ID": "trace-me-123"})
        again = client.get("/v1/voices", headers={"X-Request-ID": "trace-me-123"})
        traced = marker.headers["x-request-id"]  # the client's id leads; no other request has this one
        assert (
            traced.startswith("trace-me-123.")
            and len(traced) == 29
            and again.headers["x-request-id"] != traced
        )
        assert client.get("/health", headers={"X-Request-ID": "bad id!"}).headers["x-request-id"] != "bad id!"
        logs = client.get("/admin/logs", params={"limit": 1000}).json()["data"]
        assert any(entry["request_id"] == traced for entry in logs)
        warnings = client.get("/admin/logs", params={"level": "WARNING"}).json()["data"]
        assert all(entry["level"] in ("WARNING", "ERROR", "CRITICAL") for entry in warnings)
        status = client.get("/admin/status").json()
        assert status["scheduler"]["concurrency"] == 1 and status["readiness"]["ready"] is True
        assert status["settings"]["auth"]["signing_secret"] == "**********"  # masked
        assert client.get("/admin/logs", params={"level": "LOUD"}).status_code == 422


def test_docs_openapi_root_and_cors(server) -> None:
    with server.client() as client:
        assert client.get("/docs").status_code == 200
        spec = client.get("/openapi.json").json()
        for path in (
            "/v1/tts",
            "/v1/audio/speech",
            "/v1/voices",
            "/v1/jobs/{job_id}",
            "/admin/engine/restart",
        ):
            assert path in spec["paths"]
        body = spec["paths"]["/v1/tts"]["post"]["requestBody"]["content"]
        assert {"application/json", "multipart/form-data"} <= set(body)
        root = client.get("/", follow_redirects=False)
        assert root.status_code == 307 and root.headers["location"] == "/docs"
        allowed = client.get("/health", headers={"Origin": "https://ui.example"})
        assert allowed.headers["access-control-allow-origin"] == "https://ui.example"
        other = client.get("/health", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


def test_cors_is_off_by_default(gated) -> None:
    with gated.client() as client:
        response = client.get("/health", headers={"Origin": "https://ui.example"})
        assert "access-control-allow-origin" not in response.headers
        preflight = client.options(
            "/v1/tts", headers={"Origin": "https://ui.example", "Access-Control-Request-Method": "POST"}
        )
        assert preflight.status_code == 405 and preflight.json()["error"]["code"] == "method_not_allowed"


def test_the_real_loader_applies_the_fast_preset(demo_model_path, tmp_path) -> None:
    from cosyserve.engine.linear_kernels import FAST_KERNELS, PackedLinear
    from cosyserve.engine.quantize import int8_available
    from cosyserve.service.local.loading import load_synthesizer
    from cosyserve.service.settings import Settings

    if not int8_available():
        pytest.skip("this torch build has no int8 kernels")
    settings = Settings(model=str(demo_model_path), device="cpu", preset="fast", data_dir=tmp_path)
    synth = load_synthesizer(settings, voices=None)
    # The decoder layers' products in a reduced kernel (their int8 module is no child where a CPU with
    # bfloat16 units gives them a bfloat16 prefill path too: an Intel Xeon with AMX).
    layer = synth.engine.lm.model.qwen2.layers[0]
    products = [layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.down_proj]
    assert all(isinstance(p, PackedLinear) and p.kernel in FAST_KERNELS for p in products)
    assert synth.max_text_chars == settings.limits.max_text_chars


def test_repeated_engine_failures_make_ready_false_until_a_success(
    server, monkeypatch, prompt_wav_bytes
) -> None:
    synth = server.service.model.loaded

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with server.client() as client:
        prompt = base64.b64encode(prompt_wav_bytes).decode()
        voice_json = {
            "text": API_TEXT,
            "prompt_wav": prompt,
            "prompt_text": PROMPT_TRANSCRIPT,
            "seed": API_SEED,
        }
        monkeypatch.setattr(synth, "synthesize", broken)
        for _ in range(3):
            failed = client.post("/v1/tts", json=voice_json)
            assert failed.status_code == 500 and failed.json()["error"]["code"] == "internal"
            assert "illegal memory" not in failed.text
        ready = client.get("/ready")
        assert ready.status_code == 503 and "failed 3 times in a row" in ready.json()["error"]["message"]
        assert 'cosyserve_errors_total{kind="internal"} 3.0' in client.get("/metrics").text
        monkeypatch.undo()
        assert client.post("/v1/tts", json=voice_json).status_code == 200  # a success resets the count
        assert client.get("/ready").status_code == 200


def test_with_authentication_off_no_request_creates_the_first_key(server) -> None:
    """Auth off makes every local caller an admin: `POST /admin/keys` let any program on the host create
    the first key, which switches authentication on and locks everyone else out."""
    with server.client() as client:
        refused = client.post("/admin/keys", json={"name": "grab", "role": "admin"})
    assert refused.status_code == 403 and "cosyserve keys create" in refused.json()["error"]["message"]
    assert server.service.keys.list() == []
