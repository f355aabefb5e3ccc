"""The GPU check's numeric steps: decode paths, teacher-forced parity, TF32, finiteness, host syncs.

Bounds are generous on purpose: they catch a broken path (garbage log-probs, NaN, a wrong device),
not rounding; the measured figures go into the report and from there into the README. In a dry run
the same code runs on the CPU in float32 (graph capture and the GPU comparisons skipped).
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import numpy as np
import torch
from gpu_check_common import CheckFailed, Context, max_abs
from torch.overrides import TorchFunctionMode

from cosyserve.engine.cuda_graph import StaticDecodeStep
from cosyserve.engine.decode_batching import DecodeBatcher
from cosyserve.engine.device import Placement, float32_exact
from cosyserve.engine.kv_cache import KVCache
from cosyserve.engine.loading import load_flow, load_hift, load_speech_lm, place_flow
from cosyserve.engine.sampling import SpeechTokenSampler
from cosyserve.engine.speech_lm_runner import SpeechLMRunner, decode_one, prefill
from cosyserve.engine.token2wav import FlowPrompt, Token2Wav
from cosyserve.modeldir.model_dir import ModelDir

# Log-prob differences of the decode paths against eager decoding in the same dtype (same weights).
PATH_TOLERANCE = {torch.float32: 1e-3, torch.float16: 5e-2, torch.bfloat16: 2e-1}
LIKELY = -9.2  # log(1e-4): log-probs compared where the token is at least this likely


def _model_dir(ctx: Context) -> ModelDir:
    return ModelDir.open(ctx.tiny_dir / "model", require_onnx=False)


def _lm_request(ctx: Context) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    with np.load(ctx.tiny_dir / "llm.npz") as golden:
        keys = ("prompt_text", "text", "prompt_speech_token", "forced_tokens")
        return tuple(torch.from_numpy(golden[k]).long() for k in keys)  # type: ignore[return-value]


def _dtypes(ctx: Context) -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16] if ctx.cuda else [torch.float32]


def _eager_rows(model: Any, embeds: torch.Tensor, forced: list[int]) -> torch.Tensor:
    weight = model.speech_embedding.weight
    cache = KVCache.allocate(
        model.config.qwen2, embeds.shape[1] + len(forced), device=weight.device, dtype=weight.dtype
    )
    rows = [prefill(model, embeds, cache)[0]]
    for token in forced[:-1]:
        rows.append(decode_one(model, torch.tensor([token], device=weight.device), cache)[0])
    return torch.stack(rows).float().cpu()


def _static_rows(model: Any, embeds: torch.Tensor, forced: list[int], capture: bool) -> torch.Tensor:
    step = StaticDecodeStep(model, 256, capture=capture)
    rows = [prefill(model, embeds, step.reset())[0]]
    rows += [step(token)[0] for token in forced[:-1]]
    return torch.stack(rows).float().cpu()


def _batched_rows(model: Any, embeds: list[torch.Tensor], forced: list[int]) -> list[torch.Tensor]:
    """Each request in its own thread, decoding through one DecodeBatcher (rows batched together)."""
    batcher = DecodeBatcher(model, max_batch=len(embeds), window_s=0.2)
    weight = model.speech_embedding.weight
    out: list[Any] = [None] * len(embeds)

    def run(index: int) -> None:
        cache = KVCache.allocate(
            model.config.qwen2, embeds[index].shape[1] + len(forced), device=weight.device, dtype=weight.dtype
        )
        rows = [prefill(model, embeds[index], cache)[0]]
        member = batcher.join(cache)
        try:
            rows += [batcher.step(member, token) for token in forced[:-1]]
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
def compare_decode_paths(ctx: Context, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    model = load_speech_lm(_model_dir(ctx), device, dtype)
    prompt_text, text, speech, forced = _lm_request(ctx)
    forced_ids = forced[: ctx.sizes["decode_steps"]].tolist()
    embeds = model.embed_prefix(prompt_text, text, speech)
    other = model.embed_prefix(prompt_text[:4], text[:3], speech[:10])
    eager = _eager_rows(model, embeds, forced_ids)
    graph = _static_rows(model, embeds, forced_ids, capture=device.type == "cuda")
    batched = _batched_rows(model, [embeds, other], forced_ids)
    found = {"graph_vs_eager": max_abs(graph, eager), "batched_vs_eager": max_abs(batched[0], eager)}
    found["finite"] = bool(torch.isfinite(eager).any(dim=1).all())
    found["tolerance"] = PATH_TOLERANCE[dtype]
    if not found["finite"] or max(found["graph_vs_eager"], found["batched_vs_eager"]) > PATH_TOLERANCE[dtype]:
        raise CheckFailed(f"{dtype} decode paths disagree with eager decoding on {device}", found)
    return found


def decode_paths(ctx: Context) -> dict[str, Any]:
    """CUDA-graph and batched LM steps give eager decoding's log-probs (float16 and bfloat16 on a GPU)."""
    return {str(dtype): compare_decode_paths(ctx, ctx.device, dtype) for dtype in _dtypes(ctx)}


def second_gpu(ctx: Context) -> dict[str, Any]:
    """The graph path with the model on cuda:1 while cuda:0 is current (a capture on the wrong device
    records nothing: issue 21, item 1)."""
    torch.cuda.set_device(0)
    return compare_decode_paths(ctx, torch.device("cuda", 1), torch.float16)


def _lm_logp(ctx: Context, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    model = load_speech_lm(_model_dir(ctx), device, dtype)
    prompt_text, text, speech, forced = _lm_request(ctx)
    with torch.inference_mode():
        return _eager_rows(model, model.embed_prefix(prompt_text, text, speech), forced.tolist())


def _flow_mel(ctx: Context, placement: Placement) -> torch.Tensor:
    flow = place_flow(load_flow(_model_dir(ctx)), placement)
    prompt, tokens = _flow_inputs(ctx, placement.device)
    with torch.autocast(placement.device.type, dtype=placement.dtype, enabled=placement.autocast_enabled):
        return flow.inference(tokens, prompt.speech_token, prompt.speech_feat, prompt.embedding).float().cpu()


def _flow_inputs(ctx: Context, device: torch.device) -> tuple[FlowPrompt, torch.Tensor]:
    with np.load(ctx.tiny_dir / "flow.npz") as golden:
        prompt = FlowPrompt(
            torch.from_numpy(golden["prompt_token"]).long()[None],
            torch.from_numpy(golden["prompt_feat"]).float()[None].to(device),
            torch.from_numpy(golden["embedding"]).float()[None].to(device),
        )
        return prompt, torch.from_numpy(golden["token"]).long()[None]


def teacher_forced(ctx: Context) -> dict[str, Any]:
    """CPU float32 against the GPU in float32 and float16: the LM teacher-forced on the fixture's
    tokens (|d logp| where p >= 1e-4, top-1 agreement) and the flow's one-shot mel."""
    cpu = torch.device("cpu")
    reference_logp = _lm_logp(ctx, cpu, torch.float32)
    reference_mel = _flow_mel(ctx, Placement(cpu))
    found: dict[str, Any] = {"reference": "CPU float32", "steps": int(reference_logp.shape[0])}
    if not ctx.cuda:
        found["gpu"] = "skipped (dry run)"
        return found
    bounds = {torch.float32: (1e-3, 1.0, 1e-2), torch.float16: (0.5, 0.9, 0.2)}
    for dtype, (logp_bound, top1_bound, mel_bound) in bounds.items():
        logp = _lm_logp(ctx, ctx.device, dtype)
        likely = reference_logp > LIKELY
        mel = _flow_mel(ctx, Placement(ctx.device, dtype))
        entry = {
            "lm_max_abs_logp_likely": float((logp - reference_logp).abs()[likely].max()),
            "lm_top1_agreement": float((logp.argmax(1) == reference_logp.argmax(1)).float().mean()),
            "flow_max_abs_mel": max_abs(mel, reference_mel),
            "flow_mean_abs_mel": float((mel - reference_mel).abs().mean()),
        }
        found[str(dtype)] = entry
        if (
            entry["lm_max_abs_logp_likely"] > logp_bound
            or entry["lm_top1_agreement"] < top1_bound
            or entry["flow_mean_abs_mel"] > mel_bound
        ):
            raise CheckFailed(f"GPU {dtype} is too far from the CPU reference", found)
    return found


def vocoder_tf32(ctx: Context) -> dict[str, Any]:
    """The float32 vocoder on the GPU against the CPU, with TF32 off (as the engine runs it) and on."""
    with np.load(ctx.tiny_dir / "hift.npz") as golden:
        mel = torch.from_numpy(golden["mel"]).float()[None]
    hift = load_hift(_model_dir(ctx))
    reference, _ = hift.inference(mel, finalize=True)
    on_gpu = load_hift(_model_dir(ctx), ctx.device)
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
        with_tf32, _ = on_gpu.inference(mel.to(ctx.device), finalize=True)
        with float32_exact():
            without, _ = on_gpu.inference(mel.to(ctx.device), finalize=True)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
    found = {
        "max_abs_wav_tf32_off": max_abs(without, reference),
        "max_abs_wav_tf32_on": max_abs(with_tf32, reference),
    }
    if found["max_abs_wav_tf32_off"] > 1e-3:
        raise CheckFailed("the vocoder without TF32 is not at float32 accuracy on this GPU", found)
    return found


@torch.inference_mode()
def finite_at_length(ctx: Context) -> dict[str, Any]:
    """Float16 (GPU) overflows at length? The full-size architecture with random weights: the LM over
    `lm_positions` positions, the flow and vocoder over `mel_frames` frames (tiny and float32 in a
    dry run)."""
    from cosyserve.bench.full_random import build_random_models
    from cosyserve.engine.loading import place_networks

    models = build_random_models("full" if ctx.cuda else "tiny", seed=0)
    placement = Placement(ctx.device, torch.float16 if ctx.cuda else torch.float32)
    llm, flow, hift = place_networks(models.llm, models.flow, models.hift, placement)
    positions, frames = ctx.sizes["lm_positions"], ctx.sizes["mel_frames"]
    generator = torch.Generator().manual_seed(0)
    speech = torch.randint(0, models.config.llm.speech_token_size, (positions,), generator=generator)
    cache = KVCache.allocate(models.config.llm.qwen2, positions, device=ctx.device, dtype=placement.dtype)
    finite_lm = True
    for start in range(0, positions, 500):
        logp = prefill(llm, llm.embed_speech(speech[start : start + 500].to(ctx.device)[None]), cache)
        finite_lm &= bool(torch.isfinite(logp).any())
    t2w = Token2Wav(flow, hift, placement)
    tokens = torch.randint(0, models.config.flow.vocab_size, (1, frames // 2), generator=generator)
    prompt = FlowPrompt(
        tokens[:, :10], torch.randn(1, 20, 80, device=ctx.device), torch.randn(1, 192, device=ctx.device)
    )
    wav = t2w.synthesize(tokens[:, 10:], prompt)
    found = {
        "lm_positions": positions,
        "lm_finite": finite_lm,
        "mel_frames": frames,
        "wav_finite": bool(torch.isfinite(wav).all()),
    }
    if not (found["lm_finite"] and found["wav_finite"]):
        raise CheckFailed("non-finite values at length", found)
    return found


class _HostReads(TorchFunctionMode):
    """Counts calls that read a tensor's value into Python (on a GPU each one waits for the device)."""

    READS = frozenset({"__bool__", "__int__", "__float__", "__index__", "item", "tolist", "numpy"})

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if getattr(func, "__name__", "") in self.READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def syncs(ctx: Context) -> dict[str, Any]:
    """Host synchronisations per LM token (expected: 1, reading the drawn id) and per flow pass
    (expected: 0), counted by torch's sync debug mode; in a dry run, host reads on the CPU path that
    the device path takes (device sampling, the flow on meta tensors)."""
    if not ctx.cuda:
        return _host_reads_dry(ctx)
    model = load_speech_lm(_model_dir(ctx), ctx.device, torch.float16)
    prompt_text, text, speech, _ = _lm_request(ctx)
    found: dict[str, Any] = {}
    for name, runner in (
        ("plain", SpeechLMRunner(model)),
        ("cuda_graph", SpeechLMRunner(model, use_cuda_graph=True)),
    ):
        list(runner.generate(text[:8], prompt_text, speech, seed=0))  # warm-up (graphs: captured at start)
        tokens, count = _count_syncs(lambda r=runner: list(r.generate(text[:8], prompt_text, speech, seed=1)))
        found[f"lm_{name}_syncs_per_token"] = count / max(1, len(tokens))
    t2w = Token2Wav(
        place_flow(load_flow(_model_dir(ctx)), Placement(ctx.device, torch.float16)),
        load_hift(_model_dir(ctx), ctx.device),
        Placement(ctx.device, torch.float16),
    )
    prompt, flow_tokens = _flow_inputs(ctx, ctx.device)
    with t2w._autocast():
        _, found["flow_pass_syncs"] = _count_syncs(
            lambda: t2w.flow.inference(flow_tokens, prompt.speech_token, prompt.speech_feat, prompt.embedding)
        )
    _, found["vocoder_pass_syncs"] = _count_syncs(lambda: t2w.synthesize(flow_tokens, prompt))
    if found["lm_cuda_graph_syncs_per_token"] > 1.5 or found["flow_pass_syncs"] > 2:
        raise CheckFailed("more host syncs than the engine needs", found)
    return found


def _count_syncs(run: Any) -> tuple[Any, int]:
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return result, sum(1 for w in caught if "synchroniz" in str(w.message).lower())


def _host_reads_dry(ctx: Context) -> dict[str, Any]:
    sampler = SpeechTokenSampler(_model_dir(ctx).config.llm.sampling, 6561, seed=0, on_device=True)
    logp = torch.randn(6761).log_softmax(0)
    steps = ctx.sizes["sync_tokens"]
    sampler.sample(logp.clone())  # the first draw seeds the device generator from the request's (host)
    with _HostReads() as reads:
        for _ in range(steps):
            sampler.sample(logp.clone())
    flow = load_flow(_model_dir(ctx)).to("meta")
    prompt, tokens = _flow_inputs(ctx, torch.device("meta"))
    with _HostReads() as flow_reads:  # ids on the device too: reading any value would raise on meta
        flow.inference(
            tokens.to("meta"), prompt.speech_token.to("meta"), prompt.speech_feat, prompt.embedding
        )
    found = {
        "device_sampling_reads_per_token": reads.count / steps,
        "flow_pass_reads_on_device": flow_reads.count,
    }
    if found["device_sampling_reads_per_token"] > 1 or found["flow_pass_reads_on_device"]:
        raise CheckFailed("the device path reads values back to the host", found)
    return found
