"""Batched LM decoding across concurrent requests (`engine.decode_batching`), on CPU tensors.

The batched forward must give every request the log-probs it gets alone, whoever else is in the batch;
members join and leave at any step; a failure reaches every member; cancelling leaves the batch.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cosyserve.engine.decode_batching import BatchError, DecodeBatcher, Rendezvous
from cosyserve.engine.kv_cache import KVCache
from cosyserve.engine.speech_lm_runner import SpeechLMRunner, decode_one, prefill
from cosyserve.errors import Cancelled, InputError, OutOfMemory
from cosyserve.model.speech_lm import SpeechLM
from cosyserve.modeldir.model_dir import ModelDir

WINDOW_S = 0.5  # generous: members of a test batch always arrive together, even on a busy machine


@pytest.fixture(scope="module")
def model(tiny_dir: Path) -> SpeechLM:
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    return SpeechLM.from_checkpoint(model_dir.file("llm.pt"), model_dir.config.llm)


@pytest.fixture(scope="module")
def golden(tiny_dir: Path) -> dict[str, np.ndarray]:
    return dict(np.load(tiny_dir / "llm.npz"))


@pytest.fixture(scope="module")
def requests(golden) -> list[tuple[list[int], list[int], list[int], int]]:
    """Three requests with different prefix lengths (text, prompt text, prompt speech, seed)."""
    text, prompt_text, speech = (golden[k].tolist() for k in ("text", "prompt_text", "prompt_speech_token"))
    return [
        (text[:4], prompt_text, speech, 1),
        (text[4:7], prompt_text[:8], speech[:20], 2),
        (text[7:12], prompt_text[2:], speech[40:45], 3),
    ]


def _prefilled(model: SpeechLM, request, extra: int = 8) -> tuple[KVCache, torch.Tensor]:
    text, prompt_text, speech, _ = request
    embeds = model.embed_prefix(*(torch.tensor(x) for x in (prompt_text, text, speech)))
    cache = KVCache.allocate(model.config.qwen2, embeds.shape[1] + extra)
    return cache, prefill(model, embeds, cache)


def _run_threads(targets) -> list:
    """Run each callable in its own thread (started together); return results or raise the first error."""
    results: list = [None] * len(targets)
    errors: list = [None] * len(targets)
    barrier = threading.Barrier(len(targets))

    def run(index: int) -> None:
        barrier.wait()
        try:
            results[index] = targets[index]()
        except BaseException as exc:
            errors[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(targets))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive(), "a batched request hung"
    return [e if e is not None else r for r, e in zip(results, errors, strict=True)]


@torch.inference_mode()
def test_decode_rows_equals_each_unbatched_step(model: SpeechLM, requests) -> None:
    """One padded forward over caches of different lengths gives each request its own log-probs."""
    caches = [_prefilled(model, r)[0] for r in requests]
    assert len({c.length for c in caches}) == 3
    pool = KVCache.allocate(model.config.qwen2, max(c.capacity for c in caches), batch=3)
    for row, cache in enumerate(caches):
        cache.clone().copy_into(pool, row)
    worst = 0.0
    for step, tokens in enumerate([[5, 17, 900], [6560, 3, 42], [1, 1, 1]]):
        positions = [c.length for c in caches]
        expected = torch.cat(
            [decode_one(model, torch.tensor([t]), c) for t, c in zip(tokens, caches, strict=True)]
        )
        got = model.decode_rows(
            torch.tensor(tokens), pool.buffer, torch.tensor(positions), max(positions) + 1 + step % 2
        )
        worst = max(worst, float((got - expected).abs().max()))
    assert worst <= 1e-5


@torch.inference_mode()
def test_batcher_step_equals_unbatched(model: SpeechLM, requests) -> None:
    batcher = DecodeBatcher(model, max_batch=4, window_s=WINDOW_S, capacity_step=16)
    alone, members = [], []
    for request in requests:
        cache, _ = _prefilled(model, request)
        reference = cache.clone()
        alone.append([decode_one(model, torch.tensor([t]), reference)[0] for t in (7, 8, 9)])
        members.append(batcher.join(cache))
    assert batcher.active == 3 and batcher.pool_capacity % 16 == 0

    def steps(index: int):
        return lambda: [batcher.step(members[index], t) for t in (7, 8, 9)]

    batched = _run_threads([steps(i) for i in range(3)])
    for got, expected in zip(batched, alone, strict=True):
        assert max(float((g - e).abs().max()) for g, e in zip(got, expected, strict=True)) <= 1e-5
    assert batcher.batches == 3 and batcher.rows == 9  # three steps, all three requests in each
    for member in members:
        batcher.leave(member)
        batcher.leave(member)  # idempotent
    assert batcher.active == 0
    with pytest.raises(InputError, match="left the decode batch"):
        batcher.step(members[0], 1)


@torch.inference_mode()
def test_a_nan_left_in_a_pool_slot_does_not_reach_the_next_member(model: SpeechLM, requests) -> None:
    """Slots are reused: a member shorter than the longest in its batch reads positions past its
    length, where an earlier member's values may lie. The step masks them out of the scores only, so a
    NaN there would still reach the output (weight 0 times NaN is NaN): a slot changing hands, by a
    member moving into it on `leave` or by `join`, must not carry them."""
    batcher = DecodeBatcher(model, max_batch=3, window_s=WINDOW_S, capacity_step=16)
    caches = {name: _prefilled(model, requests[i], extra=12)[0] for name, i in (("x", 2), ("y", 0), ("z", 1))}
    caches["v"] = _prefilled(model, requests[2], extra=12)[0]
    assert caches["y"].length > max(caches[n].length for n in "xzv")  # y is the long one
    references = {name: cache.clone() for name, cache in caches.items()}
    members = {name: batcher.join(caches[name]) for name in "xyz"}
    pool = batcher._pool.buffer  # the pool the members share

    def step_together(names: str, tokens: tuple[int, ...]) -> None:
        got = _run_threads([lambda n=n: [batcher.step(members[n], t) for t in tokens] for n in names])
        for name, rows in zip(names, got, strict=True):
            expected = [decode_one(model, torch.tensor([t]), references[name])[0] for t in tokens]
            assert all(torch.isfinite(row).all() for row in rows), name
            assert max(float((g - e).abs().max()) for g, e in zip(rows, expected, strict=True)) <= 1e-5

    pool[:, :, 0].fill_(float("nan"))  # x's slot: what a request that went wrong may leave
    batcher.leave(members["x"])  # z, the last, moves into slot 0, past its length lie x's NaNs
    assert members["z"].slot == 0
    step_together("zy", (7, 8))
    batcher.leave(members["z"])  # y moves into slot 0
    pool[:, :, 1].fill_(float("nan"))  # the slot y left, now free
    members["v"] = batcher.join(caches["v"])
    assert members["v"].slot == 1
    step_together("yv", (9, 10))
    for name in "yv":
        batcher.leave(members[name])


def test_concurrent_generation_gives_each_request_its_solo_tokens(model: SpeechLM, requests) -> None:
    solo = SpeechLMRunner(model)
    expected = [list(solo.generate(t, p, s, seed=seed)) for t, p, s, seed in requests]
    assert len({len(tokens) for tokens in expected}) > 1  # they finish at different steps: members leave
    batcher = DecodeBatcher(model, max_batch=4, window_s=WINDOW_S)
    batched = SpeechLMRunner(model, batch_decode=batcher)
    got = _run_threads([lambda r=r: list(batched.generate(r[0], r[1], r[2], seed=r[3])) for r in requests])
    assert got == expected
    assert batcher.active == 0
    assert batcher.rows > batcher.batches  # steps really were shared


def test_members_join_and_leave_mid_run(model: SpeechLM, requests) -> None:
    """A request joins while another is decoding; a third that finds every slot taken decodes alone."""
    solo = SpeechLMRunner(model)
    expected = [list(solo.generate(t, p, s, seed=seed)) for t, p, s, seed in requests]
    batcher = DecodeBatcher(model, max_batch=2, window_s=WINDOW_S)
    runner = SpeechLMRunner(model, batch_decode=batcher)
    first_tokens = threading.Event()
    sizes: list[int] = []

    def first() -> list[int]:
        tokens = []
        for token in runner.generate(*requests[0][:3], seed=requests[0][3]):
            tokens.append(token)
            sizes.append(batcher.active)
            if len(tokens) == 5:
                first_tokens.set()
                # Hold on until another request has joined: on a loaded machine the rest of this one's
                # tokens could otherwise all come before the others have even prefilled.
                deadline = time.monotonic() + 30
                while batcher.active < 2 and time.monotonic() < deadline:
                    time.sleep(0.001)
        return tokens

    def later(index: int):
        def run() -> list[int]:
            first_tokens.wait(30)
            return list(runner.generate(*requests[index][:3], seed=requests[index][3]))

        return run

    got = _run_threads([first, later(1), later(2)])
    assert got == expected
    assert sizes[0] == 1 and max(sizes) == 2  # alone at first, then joined (the third found no slot)
    assert batcher.active == 0


def test_failed_forward_raises_in_every_member(model: SpeechLM, requests, monkeypatch) -> None:
    batcher = DecodeBatcher(model, max_batch=4, window_s=WINDOW_S)
    members = [batcher.join(_prefilled(model, r)[0]) for r in requests]

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(model, "decode_rows", broken)
    outcome = _run_threads([lambda m=m: batcher.step(m, 5) for m in members])
    for error in outcome:
        assert isinstance(error, BatchError)
        assert isinstance(error.__cause__, RuntimeError) and "device lost" in str(error.__cause__)
    assert (batcher.batches, batcher.rows) == (1, 3)  # one batch held all three
    lengths = [_prefilled(model, r)[0].length for r in requests]
    assert [m.length for m in members] == lengths  # nothing advanced
    monkeypatch.undo()
    for member in members:
        batcher.leave(member)


def test_failed_forward_ends_every_generation(model: SpeechLM, requests, monkeypatch) -> None:
    """Once the forward fails, every request's generator raises and leaves; the batcher stays usable."""
    batcher = DecodeBatcher(model, max_batch=4, window_s=WINDOW_S)
    runner = SpeechLMRunner(model, batch_decode=batcher)

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(model, "decode_rows", broken)
    outcome = _run_threads([lambda r=r: list(runner.generate(r[0], r[1], r[2], seed=r[3])) for r in requests])
    assert all(isinstance(error, BatchError) for error in outcome), outcome
    assert batcher.active == 0
    monkeypatch.undo()
    assert list(runner.generate(*requests[0][:3], seed=requests[0][3])) == list(
        SpeechLMRunner(model).generate(*requests[0][:3], seed=requests[0][3])
    )


@pytest.fixture
def freed(monkeypatch) -> list[int]:
    """Pretend a CUDA context exists and count `torch.cuda.empty_cache` calls."""
    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    return calls


def _out_of_memory(*args, **kwargs):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_out_of_memory_is_a_typed_error_for_each_member(
    model: SpeechLM, requests, monkeypatch, freed
) -> None:
    """Issue 21, item 4: not a BatchError in every member; the cache freed, the batcher still usable."""
    batcher = DecodeBatcher(model, max_batch=4, window_s=WINDOW_S)
    members = [batcher.join(_prefilled(model, r)[0]) for r in requests]
    lengths = [m.length for m in members]
    monkeypatch.setattr(model, "decode_rows", _out_of_memory)
    outcome = _run_threads([lambda m=m: batcher.step(m, 5) for m in members])
    for error in outcome:
        assert isinstance(error, OutOfMemory) and not isinstance(error, BatchError), error
        assert error.retry_after_s > 0 and "out of memory" in str(error)
        assert isinstance(error.__cause__, torch.cuda.OutOfMemoryError)
    assert len(freed) == 2  # after the first failure and after the retry
    assert [m.length for m in members] == lengths  # nothing advanced
    monkeypatch.undo()
    expected = [decode_one(model, torch.tensor([5]), _prefilled(model, r)[0]) for r in requests]
    got = _run_threads([lambda m=m: batcher.step(m, 5) for m in members])
    for row, want in zip(got, expected, strict=True):
        assert float((row - want[0]).abs().max()) <= 1e-5  # the bound of the batched-step tests above
    for member in members:
        batcher.leave(member)


def test_a_passing_out_of_memory_is_retried_once(model: SpeechLM, requests, monkeypatch, freed) -> None:
    batcher = DecodeBatcher(model, max_batch=4, window_s=WINDOW_S)
    member = batcher.join(_prefilled(model, requests[0])[0])
    real = model.decode_rows
    failures = [1]

    def flaky(*args, **kwargs):
        if failures:
            failures.pop()
            _out_of_memory()
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "decode_rows", flaky)
    assert batcher.step(member, 5).shape == (model.config.decoder_size,)
    assert len(freed) == 1 and member.steps == 1
    batcher.leave(member)


def test_out_of_memory_in_a_flow_batch_fails_only_what_does_not_fit(freed) -> None:
    """Independent items (flow batches) are retried in halves: only the item that fits nowhere fails."""

    class Flows(Rendezvous[int, int]):
        split_on_oom = True

        def run_batch(self, items: list[int]) -> list[int]:
            sizes.append(len(items))
            if 99 in items or len(items) > 2:
                _out_of_memory()
            return [2 * item for item in items]

    sizes: list[int] = []
    flows = Flows(max_batch=4, window_s=WINDOW_S)
    outcome = _run_threads([lambda i=i: flows.submit(i) for i in (1, 2, 99, 3)])
    assert sorted(x for x in outcome if isinstance(x, int)) == [2, 4, 6]
    assert [type(x) for x in outcome].count(OutOfMemory) == 1
    assert flows.submit(5) == 10  # healthy afterwards


def test_engine_turns_out_of_memory_into_a_typed_error(tiny_dir: Path, monkeypatch, freed) -> None:
    """Outside a batch too: a segment answers OutOfMemory, not a raw torch error; the engine recovers."""
    from cosyserve.engine.device import Placement
    from cosyserve.engine.pipeline import SegmentInput, SpeechEngine
    from cosyserve.engine.token2wav import FlowPrompt

    engine = SpeechEngine.load(
        ModelDir.open(tiny_dir / "model", require_onnx=False), Placement(torch.device("cpu"))
    )
    golden = np.load(tiny_dir / "flow.npz")
    prompt = FlowPrompt(
        torch.from_numpy(golden["prompt_token"]).long().reshape(1, -1),
        torch.from_numpy(golden["prompt_feat"]).float().reshape(1, -1, 80),
        torch.from_numpy(golden["embedding"]).float().reshape(1, -1),
    )
    llm = np.load(tiny_dir / "llm.npz")
    segment = SegmentInput(llm["text"][:3].tolist(), llm["prompt_text"].tolist(), [], prompt)
    monkeypatch.setattr(engine.lm.model, "forward", _out_of_memory)
    with pytest.raises(OutOfMemory, match="out of memory"):
        list(engine.generate(segment, generator=torch.Generator().manual_seed(0), stream=False))
    assert freed == [1]
    monkeypatch.undo()
    audio = list(engine.generate(segment, generator=torch.Generator().manual_seed(0), stream=False))
    assert audio and all(np.isfinite(a).all() for a in audio)


def test_cancel_leaves_the_batch(model: SpeechLM, requests) -> None:
    solo = SpeechLMRunner(model)
    expected = list(solo.generate(*requests[0][:3], seed=requests[0][3]))
    batcher = DecodeBatcher(model, max_batch=4, window_s=WINDOW_S)
    runner = SpeechLMRunner(model, batch_decode=batcher)
    cancel = threading.Event()
    sizes_after_cancel: list[int] = []

    def cancelled() -> list[int]:
        tokens = []
        for token in runner.generate(*requests[1][:3], seed=requests[1][3], cancel=cancel):
            tokens.append(token)
            if len(tokens) == 3:
                cancel.set()
        return tokens

    def other() -> list[int]:
        tokens = []
        for token in runner.generate(*requests[0][:3], seed=requests[0][3]):
            tokens.append(token)
            if len(tokens) == 2:  # still running when the other one is cancelled, however busy the CPU
                cancel.wait(30)
            if cancel.is_set():
                sizes_after_cancel.append(batcher.active)
        return tokens

    short, full = _run_threads([cancelled, other])
    assert len(short) == 3 and full == expected
    assert sizes_after_cancel[-1] == 1
    assert batcher.active == 0


def test_leave_from_another_thread_cancels_a_waiting_step(model: SpeechLM, requests) -> None:
    batcher = DecodeBatcher(model, max_batch=4, window_s=30.0)
    waiting = batcher.join(_prefilled(model, requests[0])[0])
    idle = batcher.join(_prefilled(model, requests[1])[0])  # never steps: the other waits for it
    assert waiting is not None and idle is not None
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(_capture(lambda: batcher.step(waiting, 4))))
    thread.start()
    time.sleep(0.1)
    batcher.leave(waiting)
    thread.join(10)
    assert not thread.is_alive() and isinstance(outcome[0], Cancelled)
    batcher.leave(idle)
    assert batcher.active == 0 and batcher.batches == 0


def test_window_bounds_the_wait_for_absent_members(model: SpeechLM, requests) -> None:
    """A member that does not step holds the others back one window at most, then is not waited for."""
    batcher = DecodeBatcher(model, max_batch=4, window_s=0.05)
    cache, _ = _prefilled(model, requests[0])
    reference = cache.clone()
    stepping = batcher.join(cache)
    absent = batcher.join(_prefilled(model, requests[1])[0])
    with torch.inference_mode():
        for token in (3, 4, 5):
            expected = decode_one(model, torch.tensor([token]), reference)[0]
            assert float((batcher.step(stepping, token) - expected).abs().max()) <= 1e-5
    assert absent is not None and absent.away and absent.length == _prefilled(model, requests[1])[0].length
    batcher.leave(stepping)
    batcher.leave(absent)


def test_rendezvous_respects_max_batch() -> None:
    class Doubler(Rendezvous[int, int]):
        def run_batch(self, items: list[int]) -> list[int]:
            sizes.append(len(items))
            time.sleep(0.01)
            return [2 * item for item in items]

    sizes: list[int] = []
    doubler = Doubler(max_batch=2, window_s=0.05)
    assert _run_threads([lambda i=i: doubler.submit(i) for i in range(5)]) == [0, 2, 4, 6, 8]
    assert max(sizes) <= 2 and sum(sizes) == 5
    with pytest.raises(ValueError):
        Doubler(max_batch=0, window_s=0)


def _capture(call):
    try:
        return call()
    except BaseException as exc:
        return exc


def test_engine_options_wire_the_batchers(tiny_dir: Path) -> None:
    from cosyserve.engine.device import Placement
    from cosyserve.engine.pipeline import EngineOptions, SpeechEngine

    assert EngineOptions.for_device("cpu", 4) == EngineOptions()  # CPU: the plain exact path
    gpu = EngineOptions.for_device("cuda", 3)
    assert gpu.batch_decode and gpu.batch_flow and gpu.max_batch == 3 and not gpu.cuda_graph
    assert EngineOptions.for_device("cuda", 1).cuda_graph
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    placement = Placement(torch.device("cpu"))
    plain = SpeechEngine.load(model_dir, placement)
    assert plain.lm.batcher is None and plain.token2wav.flow_batcher is None and plain.token2wav.exact
    options = EngineOptions(batch_decode=True, max_batch=3, batch_flow=True, flow_steps=5, guidance=False)
    engine = SpeechEngine.load(model_dir, placement, options)
    assert engine.lm.batcher is not None and engine.lm.batcher.max_batch == 3
    assert engine.token2wav.flow_batcher is not None and engine.token2wav.flow_steps == 5
    assert not engine.token2wav.guidance and not engine.token2wav.exact


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_concurrent_generation_on_cuda(model: SpeechLM, requests) -> None:
    import copy

    on_gpu = copy.deepcopy(model).to("cuda")
    solo = SpeechLMRunner(on_gpu)
    expected = [list(solo.generate(t, p, s, seed=seed)) for t, p, s, seed in requests]
    batcher = DecodeBatcher(on_gpu, max_batch=4, window_s=WINDOW_S)
    batched = SpeechLMRunner(on_gpu, batch_decode=batcher)
    got = _run_threads([lambda r=r: list(batched.generate(r[0], r[1], r[2], seed=r[3])) for r in requests])
    assert got == expected and batcher.rows > batcher.batches
