"""The GPU check's serving-path steps (issue 31): reused KV buffers and CUDA graphs captured at start.

- stale_kv: a static decode step and a decode-batch slot, left full of NaN by an earlier request, give
  the next request exactly the log-probs of a clean buffer (the masked step reads the whole capacity:
  a stale NaN value times its weight 0 would still be NaN). Runs in a dry run too (eager on the CPU).
- graphs_at_start: the runner captures every planned bucket when it is built, logs the time, and no
  request captures afterwards, whatever its length.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from gpu_check_common import CheckFailed, Context, max_abs
from gpu_check_numerics import _dtypes, _lm_request, _model_dir

from cosyserve.engine.cuda_graph import DEFAULT_GRAPH_POSITIONS, StaticDecodeStep, capture_plan
from cosyserve.engine.decode_batching import DecodeBatcher
from cosyserve.engine.kv_cache import KVCache
from cosyserve.engine.loading import load_speech_lm
from cosyserve.engine.speech_lm_runner import SpeechLMRunner, prefill

FORCED = (5, 17, 900, 3)


def _static_logp(model: Any, embeds: torch.Tensor, step: StaticDecodeStep) -> torch.Tensor:
    rows = [prefill(model, embeds, step.reset())[0]] + [step(token)[0] for token in FORCED]
    return torch.stack(rows).float().cpu()


def _batched_logp(model: Any, batcher: DecodeBatcher, embeds: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each request in its own thread through `batcher`, the first one longer than the others."""
    weight = model.speech_embedding.weight
    out: list[Any] = [None] * len(embeds)

    def run(index: int) -> None:
        cache = KVCache.allocate(
            model.config.qwen2, embeds[index].shape[1] + 8, device=weight.device, dtype=weight.dtype
        )
        rows = [prefill(model, embeds[index], cache)[0]]
        member = batcher.join(cache)
        try:
            rows += [batcher.step(member, token) for token in FORCED]
        finally:
            batcher.leave(member)
        out[index] = torch.stack(rows).float().cpu()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(embeds))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    if any(o is None for o in out):
        raise CheckFailed("a batched decode thread failed or hung")
    return out


@torch.inference_mode()
def _stale_kv(ctx: Context, dtype: torch.dtype) -> dict[str, Any]:
    model = load_speech_lm(_model_dir(ctx), ctx.device, dtype)
    prompt_text, text, speech, _ = _lm_request(ctx)
    long = model.embed_prefix(prompt_text, text, speech)
    short = model.embed_prefix(prompt_text[:4], text[:3], speech[:10])
    step = StaticDecodeStep(model, 256)
    clean = _static_logp(model, short, step)
    step.cache.buffer.fill_(float("nan"))
    reused = _static_logp(model, short, step)
    batcher = DecodeBatcher(model, max_batch=2, window_s=0.2)
    clean_rows = _batched_logp(model, batcher, [long, short])
    batcher._pool.buffer.fill_(float("nan"))  # every slot, as a failed request may leave it
    reused_rows = _batched_logp(model, batcher, [long, short])
    found = {
        "static_step_finite": bool(torch.isfinite(reused).all()),
        "static_step_vs_clean": max_abs(reused, clean),
        "batch_slot_finite": all(bool(torch.isfinite(r).all()) for r in reused_rows),
        "batch_slot_vs_clean": max(max_abs(a, b) for a, b in zip(reused_rows, clean_rows, strict=True)),
        "graph": step.captured,
    }
    if not (found["static_step_finite"] and found["batch_slot_finite"]):
        raise CheckFailed(f"a NaN left in a reused {dtype} KV buffer reached the next request", found)
    if found["static_step_vs_clean"] > 0 or found["batch_slot_vs_clean"] > 1e-3:
        raise CheckFailed(f"a reused {dtype} KV buffer changed the next request's log-probs", found)
    return found


def stale_kv(ctx: Context) -> dict[str, Any]:
    """Reused static steps and batch slots hold no stale values that reach a request (issue 31)."""
    return {str(dtype): _stale_kv(ctx, dtype) for dtype in _dtypes(ctx)}


def graphs_at_start(ctx: Context) -> dict[str, Any]:
    """Every planned CUDA graph is captured when the runner is built; none while requests run."""
    model = load_speech_lm(_model_dir(ctx), ctx.device, torch.float16)
    captures: list[int] = []
    capture = StaticDecodeStep._capture

    def counted(step: StaticDecodeStep) -> None:
        captures.append(step.capacity)
        capture(step)

    StaticDecodeStep._capture = counted  # type: ignore[method-assign]
    try:
        started = time.perf_counter()
        runner = SpeechLMRunner(model, use_cuda_graph=True)
        found: dict[str, Any] = {"start_capture_s": round(time.perf_counter() - started, 3)}
        found["captured_at_start"] = list(captures)
        prompt_text, text, speech, _ = _lm_request(ctx)
        for length in (2, 8, len(text)):
            started = time.perf_counter()
            tokens = list(runner.generate(text[:length], prompt_text, speech, seed=0))
            found[f"request_text_{length}_s"] = round(time.perf_counter() - started, 3)
            found[f"request_text_{length}_tokens"] = len(tokens)
    finally:
        StaticDecodeStep._capture = capture  # type: ignore[method-assign]
    plan = capture_plan(DEFAULT_GRAPH_POSITIONS, model.qwen2.rotary.max_positions, 8)
    found["plan"] = plan
    found["captured_while_serving"] = captures[len(found["captured_at_start"]) :]
    if found["captured_at_start"] != plan or found["captured_while_serving"]:
        raise CheckFailed("CUDA graphs were not all captured at start, or a request captured one", found)
    return found
