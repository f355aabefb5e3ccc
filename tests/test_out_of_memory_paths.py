"""Out of memory anywhere in a synthesis or an enrolment is a 503 `out_of_memory` with Retry-After, never a
500, and the engine serves the next request: the LM, the flow's prompt cache, the prompt models on
onnxruntime, the host's own arrays (MemoryError), the encoders, and jobs. The errors are injected on the CPU
at those points, as the libraries raise them."""

from __future__ import annotations

import time

import pytest
import torch
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, RuntimeException
from tests.conftest import API_TEXT, enrol_voice, sharing

from cosyserve.engine.memory import out_of_memory_as_error
from cosyserve.errors import OutOfMemory, error_code, is_out_of_memory
from cosyserve.service.local import results as results_module  # where a result is encoded and stored
from cosyserve.service.local import synthesis_stream as synthesis_stream_module
from cosyserve.service.requests import SynthesisRequest

ORT_ARENA = (
    "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running Conv node. "
    "Name:'/layer1/conv' Status Message: /onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:376 "
    "void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*, bool, "
    "onnxruntime::WaitNotificationFn) Failed to allocate memory for requested buffer of size 1073741824"
)
ORT_BAD_ALLOC = "[ONNXRuntimeError] : 1 : FAIL : std::bad_alloc"


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        MemoryError(),
        RuntimeException(ORT_ARENA),
        Fail(ORT_BAD_ALLOC),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        RuntimeError("cuFFT error: CUFFT_ALLOC_FAILED"),
        RuntimeException("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : CUDA failure 2: out of memory"),
        RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"),
    ],
)
def test_allocation_failures_are_recognised_and_typed(error: BaseException) -> None:
    assert is_out_of_memory(error) and error_code(error) == "out_of_memory"
    oom = out_of_memory_as_error("the test")
    with pytest.raises(OutOfMemory, match="ran out of memory during the test") as raised, oom:
        raise error
    assert raised.value.__cause__ is error and raised.value.retry_after_s >= 1


@pytest.mark.parametrize(
    "error",
    [RuntimeError("mat1 and mat2 shapes cannot be multiplied"), RuntimeException("bad input"), KeyError()],
)
def test_other_errors_pass_unchanged(error: BaseException) -> None:
    assert not is_out_of_memory(error) and error_code(error) == "internal"
    with pytest.raises(type(error)), out_of_memory_as_error("the test"):
        raise error


@pytest.fixture(scope="module")
def server(start_api_server, api_synthesizer, prompt_wav_bytes):
    live = start_api_server(factory=sharing(api_synthesizer))
    with live.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
    yield live
    live.stop()


@pytest.fixture
def synth(server):
    with server.service.model.synthesizer() as loaded:
        return loaded


def _raises(error: BaseException):
    def fail(*args, **kwargs):
        raise error

    return fail


def _assert_503(response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "out_of_memory"
    assert int(response.headers["retry-after"]) >= 1


def _assert_serving(client, prompt_wav_bytes) -> None:
    assert client.get("/ready").status_code == 200
    assert client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice"}).status_code == 200
    files = {"prompt_wav": ("me.wav", prompt_wav_bytes, "audio/wav")}
    assert client.post("/v1/tts", data={"text": API_TEXT}, files=files).status_code == 200


def test_prompt_models_on_onnxruntime(server, synth, prompt_wav_bytes, monkeypatch) -> None:
    """The speaker encoder's arena and the speech tokenizer's bad_alloc: enrolment and a prompt upload."""
    with server.client() as client:
        monkeypatch.setattr(synth.speaker_encoder.session, "run", _raises(RuntimeException(ORT_ARENA)))
        files = {"audio": ("prompt.wav", prompt_wav_bytes, "audio/wav")}
        _assert_503(client.post("/v1/voices", data={"name": "bob"}, files=files))
        monkeypatch.undo()
        monkeypatch.setattr(synth.speech_tokenizer.session, "run", _raises(Fail(ORT_BAD_ALLOC)))
        files = {"prompt_wav": ("me.wav", prompt_wav_bytes, "audio/wav")}
        _assert_503(client.post("/v1/tts", data={"text": API_TEXT}, files=files))
        monkeypatch.undo()
        _assert_serving(client, prompt_wav_bytes)
        assert client.get("/v1/voices/bob").status_code == 404  # nothing half-enrolled


def test_host_memory_in_synthesis_and_encoding(server, prompt_wav_bytes, monkeypatch) -> None:
    with server.client() as client:
        for _ in range(3):  # more than the unready threshold: out of memory is never an engine failure
            monkeypatch.setattr(synthesis_stream_module, "_apply_volume", _raises(MemoryError()))
            _assert_503(client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice"}))
            monkeypatch.undo()
            monkeypatch.setattr(results_module, "encode", _raises(MemoryError("Unable to allocate 2.1 GiB")))
            _assert_503(client.post("/v1/tts", json={"text": API_TEXT, "voice": "alice", "format": "mp3"}))
            monkeypatch.undo()
        _assert_serving(client, prompt_wav_bytes)


def test_flow_prompt_cache_of_a_streamed_voice(synth, monkeypatch) -> None:
    """A streamed request with a saved voice prepares the flow's prompt K/V first (before its first chunk)."""
    t2w = synth.engine.token2wav
    monkeypatch.setattr(t2w, "prepare_prompt", _raises(torch.OutOfMemoryError("CUDA out of memory")))
    monkeypatch.setattr(synth, "_flow_caches", type(synth._flow_caches)(1 << 30))  # nothing cached yet
    request = SynthesisRequest(text=API_TEXT, voice="alice", stream=True)
    with pytest.raises(OutOfMemory, match="GPU ran out of memory during a voice's streaming preparation"):
        list(synth.synthesize(request))
    monkeypatch.undo()
    assert len(synth.synthesize(request).result().audio) > 0


def test_streamed_response_before_its_first_chunk(server, synth, monkeypatch) -> None:
    """OpenAI's SSE stream reports it in its error event: status 503, code out_of_memory."""
    monkeypatch.setattr(synth.engine.lm, "generate", _raises(torch.OutOfMemoryError("CUDA out of memory")))
    with server.client() as client:
        body = {"model": "tts-1", "input": API_TEXT, "voice": "alice", "stream_format": "sse"}
        response = client.post("/v1/audio/speech", json=body)
    assert response.status_code == 200
    assert '"code": "out_of_memory"' in response.text and '"status": 503' in response.text


def test_a_job_fails_with_out_of_memory_not_internal(server, synth, prompt_wav_bytes, monkeypatch) -> None:
    monkeypatch.setattr(synth.engine.lm, "generate", _raises(MemoryError()))
    with server.client() as client:
        job = client.post("/v1/jobs", json={"text": API_TEXT, "voice": "alice"}).json()
        deadline = time.monotonic() + 60
        while (record := client.get(f"/v1/jobs/{job['id']}").json())["state"] in ("queued", "running"):
            assert time.monotonic() < deadline, record
            time.sleep(0.05)
        assert record["state"] == "failed" and record["error"]["code"] == "out_of_memory", record
        assert "ran out of memory" in record["error"]["message"]
        monkeypatch.undo()
        _assert_serving(client, prompt_wav_bytes)
