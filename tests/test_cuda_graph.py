"""The static-buffer LM decode step (`engine.cuda_graph`): eager on the CPU, captured on CUDA.

On the CPU the static step must give the normal decode step's log-probs and tokens; the CUDA tests
(capture and replay) run only where a GPU is present.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from cosyserve.engine.cuda_graph import (
    DEFAULT_GRAPH_POSITIONS,
    CudaGraphError,
    StaticDecodePool,
    StaticDecodeStep,
    capacity_bucket,
    capture_graph,
    capture_plan,
)
from cosyserve.engine.kv_cache import KVCache
from cosyserve.engine.speech_lm_runner import SpeechLMRunner, decode_one, prefill
from cosyserve.model.speech_lm import SpeechLM
from cosyserve.modeldir.model_dir import ModelDir

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def model(tiny_dir: Path) -> SpeechLM:
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    return SpeechLM.from_checkpoint(model_dir.file("llm.pt"), model_dir.config.llm)


@pytest.fixture(scope="module")
def request_ids(tiny_dir: Path) -> tuple[list[int], list[int], list[int]]:
    golden = np.load(tiny_dir / "llm.npz")
    return golden["text"][:5].tolist(), golden["prompt_text"].tolist(), golden["prompt_speech_token"].tolist()


def _static_vs_normal(model: SpeechLM, request_ids, static: StaticDecodeStep, steps: int = 20) -> float:
    text, prompt_text, speech = request_ids
    device = static.cache.buffer.device
    embeds = model.embed_prefix(*(torch.tensor(x, device=device) for x in (prompt_text, text, speech)))
    normal = KVCache.allocate(
        model.config.qwen2, embeds.shape[1] + steps, device=embeds.device, dtype=embeds.dtype
    )
    expected = prefill(model, embeds, normal)
    got = prefill(model, embeds, static.reset())
    worst = float((got - expected).abs().max())
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        token = int(torch.multinomial(expected[0].float().exp().cpu(), 1, generator=generator))
        assert int(got[0].argmax()) == int(expected[0].argmax())
        expected = decode_one(model, torch.tensor([token], device=embeds.device), normal)
        got = static(token)
        worst = max(worst, float((got.float() - expected.float()).abs().max()))
    assert static.cache.length == normal.length
    return worst


@torch.inference_mode()
def test_static_step_equals_normal_decode_on_cpu(model: SpeechLM, request_ids) -> None:
    static = StaticDecodeStep(model, 256)
    assert not static.captured and static.capacity == 256
    assert _static_vs_normal(model, request_ids, static) <= 1e-5
    # Reused for a second request: reset empties it (old positions are overwritten, never read).
    assert _static_vs_normal(model, request_ids, static) <= 1e-5


@torch.inference_mode()
def test_a_nan_left_in_a_reused_static_step_does_not_reach_the_next_request(
    model: SpeechLM, request_ids
) -> None:
    """The masked step reads the whole capacity: an earlier request's NaN keys/values past the new
    request's length must not turn its output into NaN (weight 0 times NaN is NaN)."""
    clean = StaticDecodeStep(model, 256)
    poisoned = StaticDecodeStep(model, 256)
    text, prompt_text, speech = request_ids
    prefix_cache = KVCache.allocate(model.config.qwen2, 1 + len(prompt_text))
    prefill(model, model.embed_voice_prefix(torch.tensor(prompt_text)), prefix_cache)
    for prefix in (None, prefix_cache):
        poisoned.cache.buffer.fill_(float("nan"))  # what a request that went wrong may leave
        outputs = []
        for static in (clean, poisoned):
            cache = static.reset(prefix)
            tail = [text, speech] if prefix is not None else [prompt_text, text, speech]
            embeds = (
                model.embed_request_suffix(torch.tensor(text), torch.tensor(speech))
                if prefix is not None
                else model.embed_prefix(*(torch.tensor(x) for x in tail))
            )
            steps = [prefill(model, embeds, cache)] + [static(token) for token in (5, 17, 900)]
            outputs.append(torch.cat(steps))
        assert torch.isfinite(outputs[1]).all()
        assert torch.equal(outputs[0], outputs[1])


def test_runner_with_static_steps_gives_the_same_tokens(model: SpeechLM, request_ids) -> None:
    plain = SpeechLMRunner(model)
    static = SpeechLMRunner(model)
    static.static_pool = StaticDecodePool(model, [256], capture=False)
    for seed in (0, 1):
        assert list(static.generate(*request_ids, seed=seed)) == list(plain.generate(*request_ids, seed=seed))
    assert static.static_pool.built == 1  # one step, reused
    # With a saved voice prefix, copied into the static cache.
    text, prompt_text, speech = request_ids
    prefix = static.prepare_prefix(prompt_text)
    assert list(static.generate(text, (), speech, prefix=prefix, seed=4)) == list(
        plain.generate(text, prompt_text, speech, seed=4)
    )
    # A request that finds no free step decodes the normal way.
    held = static.static_pool.acquire(100)
    assert held is not None and static.static_pool.acquire(100) is None
    assert list(static.generate(*request_ids, seed=0)) == list(plain.generate(*request_ids, seed=0))
    static.static_pool.release(held)
    pool = StaticDecodePool(model, [256, 512], capture=False)
    first, second = pool.acquire(100), pool.acquire(100)  # the smallest free bucket that fits
    assert (first.capacity, second.capacity) == (256, 512) and pool.acquire(100) is None
    pool.release(first)
    assert pool.acquire(257) is None and pool.acquire(600) is None and pool.built == 2


def test_capture_plan() -> None:
    """The buckets captured at start: every power of two up to the longest request's, the largest kept."""
    assert DEFAULT_GRAPH_POSITIONS <= 4096
    assert capture_plan(DEFAULT_GRAPH_POSITIONS, 32768, 8) == [256, 512, 1024, 2048, 4096]
    assert capture_plan(300, 32768, 8) == [256, 512]
    assert capture_plan(1, 32768, 8) == [256]
    assert capture_plan(5000, 32768, 3) == [2048, 4096, 8192]
    assert capture_plan(100_000, 1024, 8) == [256, 512, 1024]  # capped at the model's positions
    assert capture_plan(50, 128, 8) == [128]  # a model with fewer positions than the smallest bucket
    with pytest.raises(ValueError):
        capture_plan(100, 1024, 0)


class _EagerReplay:
    """Stands in for a captured graph on the CPU: `replay` runs the step's forward into its output."""

    def __init__(self, step: StaticDecodeStep) -> None:
        self.step = step

    def replay(self) -> None:
        self.step._logp = self.step._forward()


def test_every_bucket_is_captured_at_start_and_none_while_serving(
    model: SpeechLM, request_ids, monkeypatch, caplog
) -> None:
    """Capturing takes the GPU for seconds: it happens when the runner is built (engine start), for
    every planned bucket, with its time logged; requests of any length then only replay."""
    captured: list[int] = []

    def capture(step: StaticDecodeStep) -> None:
        captured.append(step.capacity)
        step._graph = _EagerReplay(step)  # type: ignore[assignment]

    monkeypatch.setattr(StaticDecodeStep, "_capture", capture)
    built: list[StaticDecodePool] = []
    for_requests = StaticDecodePool.for_requests.__func__

    def record(cls, *args, **kwargs):
        pool = for_requests(cls, *args, **kwargs)
        built.append(pool)
        return pool

    monkeypatch.setattr(StaticDecodePool, "for_requests", classmethod(record))
    monkeypatch.setattr(SpeechLMRunner, "_device", property(lambda self: torch.device("cuda")))
    caplog.set_level("INFO", logger="cosyserve.engine.cuda_graph")
    runner = SpeechLMRunner(model, use_cuda_graph=True)  # the runner's device says CUDA: it captures
    monkeypatch.undo()
    monkeypatch.setattr(StaticDecodeStep, "_capture", capture)
    assert runner.static_pool is built[0] and runner.static_pool.captured
    assert captured == [256, 512, 1024, 2048, 4096] == list(runner.static_pool.capacities)
    assert "captured 5 CUDA graphs of the LM decode step (capacities 256, 512, 1024, 2048, 4096)" in (
        caplog.text
    )
    plain = SpeechLMRunner(model)
    text, prompt_text, speech = request_ids
    for seed, text_length in ((0, len(text)), (1, 2), (2, len(text))):
        request = (text[:text_length], prompt_text, speech)
        assert list(runner.generate(*request, seed=seed)) == list(plain.generate(*request, seed=seed))
    assert len(captured) == 5  # nothing captured while serving


def test_out_of_memory_capturing_at_start_starts_without_graphs(
    model: SpeechLM, request_ids, monkeypatch, caplog
) -> None:
    """A GPU too full for the graphs' static caches still starts: eager decode steps, same tokens."""

    def capture(step: StaticDecodeStep) -> None:
        if step.capacity >= 1024:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
        step._graph = _EagerReplay(step)  # type: ignore[assignment]

    monkeypatch.setattr(StaticDecodeStep, "_capture", capture)
    monkeypatch.setattr(SpeechLMRunner, "_device", property(lambda self: torch.device("cuda")))
    runner = SpeechLMRunner(model, use_cuda_graph=True)
    monkeypatch.undo()
    assert runner.static_pool is None
    assert "ran out of memory capturing the LM decode step's CUDA graphs" in caplog.text
    expected = list(SpeechLMRunner(model).generate(*request_ids, seed=0))
    assert list(runner.generate(*request_ids, seed=0)) == expected
    monkeypatch.setattr(StaticDecodeStep, "_capture", lambda step: (_ for _ in ()).throw(KeyError("bug")))
    monkeypatch.setattr(SpeechLMRunner, "_device", property(lambda self: torch.device("cuda")))
    with pytest.raises(KeyError):  # anything else is a bug, not a full GPU
        SpeechLMRunner(model, use_cuda_graph=True)


def test_use_cuda_graph_is_ignored_on_cpu(model: SpeechLM) -> None:
    assert SpeechLMRunner(model, use_cuda_graph=True).static_pool is None
    with pytest.raises(ValueError, match="CUDA"):
        StaticDecodeStep(model, 64, capture=True)
    with pytest.raises(ValueError):
        StaticDecodeStep(model, model.qwen2.rotary.max_positions + 1)


def test_capacity_bucket() -> None:
    assert capacity_bucket(1, 32768) == 256
    assert capacity_bucket(256, 32768) == 256
    assert capacity_bucket(257, 32768) == 512
    assert capacity_bucket(5000, 32768) == 8192
    assert capacity_bucket(30000, 32768) == 32768
    assert capacity_bucket(200, 128) == 128  # capped: acquire then refuses what does not fit


class _FakeCuda:
    """Just enough of `torch.cuda` to follow which device and stream a capture uses, on the CPU.

    Like torch, a graph captured on a stream whose device is not the current one records nothing and
    torch only warns that it is empty.
    """

    def __init__(self) -> None:
        self.current_device = 0
        self.current_stream_device: int | None = None
        self.forward_calls: list[tuple[int, int | None]] = []  # (current device, current stream's device)
        self.graph_kwargs: dict = {}
        fake = self

        class Stream:
            def __init__(self, device=None) -> None:
                self.device_index = torch.device(device).index if device is not None else fake.current_device

            def wait_stream(self, other) -> None:
                pass

        class Graph:
            pass

        @contextlib.contextmanager
        def device(device):
            saved, fake.current_device = fake.current_device, torch.device(device).index
            try:
                yield
            finally:
                fake.current_device = saved

        @contextlib.contextmanager
        def stream(s):
            saved, fake.current_stream_device = fake.current_stream_device, s.device_index
            try:
                yield
            finally:
                fake.current_stream_device = saved

        @contextlib.contextmanager
        def graph(cuda_graph, stream=None, **kwargs):
            fake.graph_kwargs = {"stream": stream, **kwargs}
            capture_stream = stream if stream is not None else Stream()  # torch: the current device's
            calls = len(fake.forward_calls)
            with fake.stream(capture_stream):
                yield
            recorded = [d for d, s in fake.forward_calls[calls:] if d == s]
            if not recorded:
                warnings.warn(
                    "The CUDA Graph is empty. This usually means that the graph was attempted "
                    "to be captured on wrong device or stream.",
                    UserWarning,
                    stacklevel=2,
                )

        self.Stream, self.CUDAGraph, self.device, self.stream, self.graph = (
            Stream,
            Graph,
            device,
            stream,
            graph,
        )
        self.current_stream = lambda device=None: Stream(device)

    def install(self, monkeypatch) -> None:
        for name in ("Stream", "CUDAGraph", "device", "stream", "graph", "current_stream"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))

    def record(self) -> None:
        self.forward_calls.append((self.current_device, self.current_stream_device))


def test_capture_runs_on_the_models_device_and_a_stream_of_it(model: SpeechLM, monkeypatch) -> None:
    """Issue 21, item 1: with the model on cuda:1 and device 0 current, warm-up and capture must run on
    a stream of cuda:1 inside `torch.cuda.device(1)`; else the graph is empty and replays stale output."""
    fake = _FakeCuda()
    fake.install(monkeypatch)
    step = StaticDecodeStep(model, 64, capture=False)
    monkeypatch.setattr(
        StaticDecodeStep, "device", property(lambda self: torch.device("cuda", 1)), raising=False
    )
    forward = step._forward
    monkeypatch.setattr(step, "_forward", lambda: (fake.record(), forward())[1])
    step._capture()
    assert step.captured and fake.forward_calls
    assert all(call == (1, 1) for call in fake.forward_calls), fake.forward_calls
    assert fake.graph_kwargs["stream"].device_index == 1


def test_an_empty_capture_is_an_error(monkeypatch) -> None:
    """A capture that records nothing (here: work done off the capture stream) raises, never replays."""
    fake = _FakeCuda()
    fake.install(monkeypatch)
    with pytest.raises(CudaGraphError, match="empty"):
        capture_graph(lambda: torch.zeros(1), torch.device("cuda", 1))
    _graph, output = capture_graph(lambda: (fake.record(), torch.ones(1))[1], torch.device("cuda", 1))
    assert float(output) == 1.0


@cuda
@torch.inference_mode()
def test_captured_graph_equals_eager_on_cuda(model: SpeechLM, request_ids) -> None:
    on_gpu = _to_cuda(model)
    static = StaticDecodeStep(on_gpu, 256)
    assert static.captured
    assert _static_vs_normal(on_gpu, request_ids, static) <= 1e-4


@cuda
@torch.inference_mode()
def test_gpu_decode_step_sees_every_cached_key(model: SpeechLM, request_ids) -> None:
    """A one-token step after a prefix attends to all of it (SDPA's is_causal would see key 0 only)."""
    on_gpu = _to_cuda(model)
    text, prompt_text, speech = request_ids
    embeds = on_gpu.embed_prefix(*(torch.tensor(x, device="cuda") for x in (prompt_text, text, speech)))
    whole = KVCache.allocate(on_gpu.config.qwen2, embeds.shape[1], device="cuda")
    expected = prefill(on_gpu, embeds, whole)
    split = KVCache.allocate(on_gpu.config.qwen2, embeds.shape[1], device="cuda")
    prefill(on_gpu, embeds[:, :-1], split)
    got = on_gpu(embeds[:, -1:], split.buffer, split.reserve(1))
    assert float((got - expected).abs().max()) <= 1e-4


@cuda
def test_runner_with_cuda_graph_gives_the_same_tokens(model: SpeechLM, request_ids) -> None:
    on_gpu = _to_cuda(model)
    plain = SpeechLMRunner(on_gpu)
    graphed = SpeechLMRunner(on_gpu, use_cuda_graph=True)
    assert graphed.static_pool is not None
    assert list(graphed.generate(*request_ids, seed=0)) == list(plain.generate(*request_ids, seed=0))


def _to_cuda(model: SpeechLM) -> SpeechLM:
    import copy

    return copy.deepcopy(model).to("cuda")
