"""One timed utterance through the real engine path: LM prefill and decode, flow, vocoder.

The input is synthetic but shaped like a real request: a prompt of `prompt_seconds` (25 speech
tokens and 50 mel frames per second, random values), prompt text and text of one text token per
`SPEECH_TOKENS_PER_TEXT_TOKEN` speech tokens, and exactly `audio_seconds * 25` generated speech
tokens: stop ids are masked for the whole length (EOS ignored), so runs on different weights and
machines do the same work. Every stage calls the functions the engine uses (`prefill`, `decode_one`,
the request sampler, `Token2Wav.synthesize` or its streaming schedule), so the bench measures the
real path. Streaming interleaves decoding and chunk synthesis in one thread, as a request would.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cosyserve.bench.full_random import SCALES, build_random_models, module_bytes
from cosyserve.bench.machine import load_average, machine_info, peak_rss_bytes
from cosyserve.bench.roofline import MachineLimits, efficiency, measure_limits
from cosyserve.bench.timing import StageClock, UtteranceTiming
from cosyserve.engine.device import Placement, configure_cpu_threads, resolve_placement
from cosyserve.engine.flow_options import (
    check_flow_options,
    flow_options_label,
    is_exact,
    measure_flow_options,
    probe_mel,
)
from cosyserve.engine.kv_cache import KVCache
from cosyserve.engine.quantize import PresetResult, apply_preset, check_preset
from cosyserve.engine.sampling import SpeechTokenSampler
from cosyserve.engine.speech_lm_runner import ENDOFPROMPT_ID, decode_one, prefill
from cosyserve.engine.token2wav import DEFAULT_MAX_REUSE_BYTES, FlowPrompt, Token2Wav
from cosyserve.errors import InputError
from cosyserve.model.config import CosyVoice3Config
from cosyserve.model.flow import DEFAULT_N_TIMESTEPS, CausalFlow
from cosyserve.model.hift import HiFTVocoder
from cosyserve.model.speech_lm import SpeechLM

SPEECH_TOKENS_PER_TEXT_TOKEN = 5  # typical of the 0.5B model: ~5 speech tokens (0.2 s) per BPE token
FIRST_SPECIAL_TEXT_ID = 151643  # text ids below this are ordinary BPE tokens
MODEL_CHOICES = ("full-random", "demo")  # or a model directory


@dataclass(frozen=True)
class BenchOptions:
    model: str = "full-random"  # a model directory, "full-random" or "demo"
    device: str = "auto"
    preset: str = "exact"
    prompt_seconds: float = 6.0
    audio_seconds: float = 10.0
    stream: bool = False
    threads: int | None = None  # None: every core this process may use
    seed: int = 0
    scale: str = "full"  # full-random only: "full" (the real sizes) or "tiny" (tests)
    deviation: bool = True  # fast preset / flow options: measure the deviation from exact on a probe input
    warmup: bool = True  # one tiny pass first, so one-off initialisation is not timed
    flow_steps: int = DEFAULT_N_TIMESTEPS  # fewer: a speed option, not the exact path
    no_cfg: bool = False  # skip classifier-free guidance: a speed option, not the exact path
    max_reuse_mb: float | None = None  # streaming: the stream's flow keys/values budget; None: engine default


class Progress:
    """Receives stage messages and token counts; the default shows nothing."""

    def stage(self, message: str) -> None:
        pass

    def tokens(self, done: int, total: int) -> None:
        pass


@dataclass
class _Models:
    config: CosyVoice3Config
    llm: SpeechLM
    flow: CausalFlow
    hift: HiFTVocoder
    description: str


def run_bench(options: BenchOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Load (or build) the model, apply the preset, synthesise one utterance; return the JSON report."""
    progress = progress or Progress()
    load_at_start = load_average()
    _check_options(options)
    placement = resolve_placement(options.device, "auto")
    check_preset(options.preset, placement.device)
    if placement.device.type == "cpu":
        configure_cpu_threads(options.threads)
    torch.manual_seed(options.seed)

    started = time.perf_counter()
    with _loaded_models(options, progress) as models:
        weights_bytes = sum(module_bytes(m) for m in (models.llm, models.flow, models.hift))
        models.llm = models.llm.to(device=placement.device, dtype=placement.dtype)
        models.flow = models.flow.to(device=placement.device, dtype=placement.dtype)
        models.hift = models.hift.to(device=placement.device)
        load_seconds = time.perf_counter() - started
        if options.preset != "exact":
            progress.stage(
                f"applying preset {options.preset}"
                + (" and measuring its deviation" if options.deviation else "")
            )
        flow_reference = None
        flow_exact = is_exact(options.flow_steps, options.no_cfg)
        if options.deviation and not flow_exact:
            progress.stage("measuring the exact flow on a probe input, for the flow options' deviation")
            flow_reference = probe_mel(models.flow)  # before the preset: the exact path's weights
        preset = apply_preset(models, options.preset, measure=options.deviation)
        flow_deviation = None
        if flow_reference is not None:
            against = "exact path (10 Euler steps with CFG" + (
                ")" if options.preset == "exact" else f"; measured with the {options.preset} preset applied)"
            )
            flow_deviation = measure_flow_options(
                flow_reference, models.flow, options.flow_steps, options.no_cfg, against
            )
        budget = {} if options.max_reuse_mb is None else {"max_reuse_bytes": int(options.max_reuse_mb * 1e6)}
        token2wav = Token2Wav(
            models.flow,
            models.hift,
            placement,
            chunk_size=models.config.chunk_size,
            flow_steps=options.flow_steps,
            guidance=not options.no_cfg,
            **budget,  # type: ignore[arg-type]
        )
        inputs = _make_inputs(models.config, options, placement.device)
        if options.warmup:
            progress.stage("warm-up")
            _warm_up(models, token2wav, inputs)
        clock = StageClock(placement.device)
        progress.stage("synthesising" + (" (streaming)" if options.stream else ""))
        with clock.timing_flow(models.flow):
            timing = _run_utterance(models, token2wav, inputs, options.stream, clock, progress)
        report = _report(
            options, models, preset, inputs, timing, clock, load_seconds, weights_bytes, placement
        )
        report["flow_deviation"] = None if flow_deviation is None else flow_deviation.to_dict()
        # After the report has read the peak memory, so that these buffers never count in it.
        progress.stage("measuring this machine's memory bandwidth and matrix throughput")
        limits = measure_limits(placement.device)
        report["efficiency"] = _efficiency(limits, models, inputs, options, report)
        report["machine"] = machine_info(placement.device, load_at_start)
        return report


def _check_options(options: BenchOptions) -> None:
    if not (0.0 < options.prompt_seconds <= 30.0):
        raise InputError(f"--prompt-seconds {options.prompt_seconds}: use a value above 0 and up to 30")
    if not (0.0 < options.audio_seconds <= 120.0):
        raise InputError(f"--audio-seconds {options.audio_seconds}: use a value above 0 and up to 120")
    if options.threads is not None and options.threads < 1:
        raise InputError(f"--threads {options.threads}: use 1 or more")
    if options.scale not in SCALES:
        raise InputError(f"unknown scale {options.scale!r}: use one of {', '.join(SCALES)}")
    check_flow_options(options.flow_steps, options.no_cfg)
    if options.max_reuse_mb is not None and options.max_reuse_mb < 0:
        raise InputError(f"--max-reuse-mb {options.max_reuse_mb:g}: use 0 or more")


@contextmanager
def _loaded_models(options: BenchOptions, progress: Progress) -> Iterator[_Models]:
    if options.model == "full-random":
        progress.stage(f"building the {options.scale}-size architecture with random weights")
        random = build_random_models(options.scale, seed=options.seed)
        yield _Models(
            random.config, random.llm, random.flow, random.hift, f"full-random ({options.scale} size)"
        )
    elif options.model == "demo":
        from cosyserve.modeldir.demo_model import write_demo_model

        with tempfile.TemporaryDirectory(prefix="cosyserve-bench-") as tmp:
            progress.stage("writing the demo model")
            path = write_demo_model(Path(tmp) / "demo", seed=options.seed, progress=lambda _line: None)
            yield _load_dir(path, "demo model (random weights)", progress)
    else:
        path = Path(options.model).expanduser()
        if not path.is_dir():
            raise InputError(
                f"--model {options.model!r} is not a directory; pass a model directory, full-random or demo"
            )
        yield _load_dir(path, str(path), progress)


def _load_dir(path: Path, description: str, progress: Progress) -> _Models:
    from cosyserve.engine.loading import load_flow, load_hift, load_speech_lm
    from cosyserve.modeldir.model_dir import ModelDir

    progress.stage(f"loading {path}")
    model_dir = ModelDir.open(path, require_onnx=False)
    return _Models(
        model_dir.config, load_speech_lm(model_dir), load_flow(model_dir), load_hift(model_dir), description
    )


@dataclass(frozen=True)
class _Inputs:
    prompt_text: torch.Tensor  # (Tpt,) text ids ending in <|endofprompt|>
    text: torch.Tensor  # (Tt,)
    prompt: FlowPrompt
    speech_tokens: int  # tokens to generate


def _make_inputs(config: CosyVoice3Config, options: BenchOptions, device: torch.device) -> _Inputs:
    generator = torch.Generator().manual_seed(options.seed)
    rate = config.token_frame_rate
    prompt_tokens = max(1, round(options.prompt_seconds * rate))
    speech_tokens = max(1, round(options.audio_seconds * rate))
    vocab = min(config.llm.qwen2.vocab_size, FIRST_SPECIAL_TEXT_ID)
    prompt_text = torch.randint(
        0, vocab, (math.ceil(prompt_tokens / SPEECH_TOKENS_PER_TEXT_TOKEN),), generator=generator
    )
    if config.llm.qwen2.vocab_size > ENDOFPROMPT_ID:
        prompt_text = torch.cat([prompt_text, torch.tensor([ENDOFPROMPT_ID])])
    text = torch.randint(
        0, vocab, (math.ceil(speech_tokens / SPEECH_TOKENS_PER_TEXT_TOKEN),), generator=generator
    )
    codes = config.llm.speech_token_size
    mel_shape = (1, prompt_tokens * config.token_mel_ratio, config.flow.output_size)
    prompt = FlowPrompt(
        speech_token=torch.randint(0, codes, (1, prompt_tokens), generator=generator).to(device),
        # A log-mel of speech lies roughly in [-11, 2]; values in that range cost the same as real ones.
        speech_feat=(torch.randn(mel_shape, generator=generator) * 2 - 5).to(device),
        embedding=torch.randn(1, config.flow.spk_embed_dim, generator=generator).to(device),
    )
    return _Inputs(prompt_text, text, prompt, speech_tokens)


@torch.inference_mode()
def _warm_up(models: _Models, token2wav: Token2Wav, inputs: _Inputs) -> None:
    """A few positions through each network: first-call allocations and kernel selection are not timed."""
    device = models.llm.speech_embedding.weight.device
    embeds = models.llm.embed_prefix(
        inputs.prompt_text[:2], inputs.text[:2], inputs.prompt.speech_token[0, :2]
    )
    cache = KVCache.allocate(
        models.config.llm.qwen2,
        embeds.shape[1] + 1,
        device=device,
        dtype=models.llm.speech_embedding.weight.dtype,
    )
    prefill(models.llm, embeds, cache)
    decode_one(models.llm, torch.tensor([0], device=device), cache)
    short = FlowPrompt(
        inputs.prompt.speech_token[:, :2], inputs.prompt.speech_feat[:, :4], inputs.prompt.embedding
    )
    token2wav.synthesize(inputs.prompt.speech_token[:, :4], short)


@torch.inference_mode()
def _run_utterance(
    models: _Models,
    token2wav: Token2Wav,
    inputs: _Inputs,
    stream: bool,
    clock: StageClock,
    progress: Progress,
) -> UtteranceTiming:
    llm, config = models.llm, models.config
    device, dtype = llm.speech_embedding.weight.device, llm.speech_embedding.weight.dtype
    total = inputs.speech_tokens
    sampler = SpeechTokenSampler(config.llm.sampling, config.llm.speech_token_size, min_len=total, seed=0)
    timing = UtteranceTiming()
    voice_cache = None
    if stream:
        # A saved voice has this per-voice flow work done once, before any request: not in the total.
        prepare_start = clock.now()
        voice_cache = token2wav.prepare_prompt(inputs.prompt)
        timing.voice_prepare_seconds = clock.now() - prepare_start
        timing.voice_cache_bytes = timing.stream_prefix_peak_bytes = voice_cache.nbytes
        clock.flow_seconds = 0.0
    start = clock.now()
    cpu_start = time.process_time()
    embeds = llm.embed_prefix(inputs.prompt_text, inputs.text, inputs.prompt.speech_token[0].cpu())
    timing.prefix_positions = embeds.shape[1]
    cache = KVCache.allocate(config.llm.qwen2, embeds.shape[1] + total, device=device, dtype=dtype)
    logp = prefill(llm, embeds, cache)
    timing.prefill_seconds = clock.now() - start
    state = token2wav.start_stream(inputs.prompt, voice_cache) if stream else None
    tokens: list[int] = []
    for step in range(total):
        step_start = clock.now()
        tokens.append(sampler.sample(logp[0]))
        if step + 1 < total:
            logp = decode_one(llm, torch.tensor(tokens[-1:], device=device), cache)
        step_end = clock.now()
        if step == 0:
            timing.first_token_seconds = step_end - start
        timing.decode_seconds += step_end - step_start
        progress.tokens(step + 1, total)
        if state is not None and len(tokens) >= token2wav.tokens_needed(state):
            with clock.timing_token2wav():
                chunks = token2wav.stream_step(state, torch.tensor([tokens], device=device))
            if chunks and timing.first_chunk_seconds is None:
                timing.first_chunk_seconds = clock.now() - start
            timing.chunks += len(chunks)
            if state.flow_prefix is not None:
                held = max(timing.stream_prefix_peak_bytes or 0, state.flow_prefix.nbytes)
                timing.stream_prefix_peak_bytes = held
            timing.audio_samples += sum(int(chunk.shape[0]) for chunk in chunks)
    speech = torch.tensor([tokens], device=device)
    with clock.timing_token2wav():
        if state is None:
            wav = token2wav.synthesize(speech, inputs.prompt)
        else:
            wav = token2wav.stream_finish(state, speech)
    timing.audio_samples += int(wav.shape[0])
    timing.chunks += 1
    if state is not None and timing.first_chunk_seconds is None:  # no early chunk: the last is the first
        timing.first_chunk_seconds = clock.now() - start
    timing.total_seconds = clock.now() - start
    timing.cpu_seconds = time.process_time() - cpu_start
    return timing


def _efficiency(
    limits: MachineLimits, models: _Models, inputs: _Inputs, options: BenchOptions, report: dict[str, Any]
) -> dict[str, Any]:
    """The run against the machine's limits; the flow part for one-shot (non-streaming) runs only."""
    prompt_tokens = int(inputs.prompt.speech_token.shape[1])
    return efficiency(
        limits,
        models.llm,
        report["decode_tokens_per_second"],
        None if options.stream else models.flow,
        frames=(prompt_tokens + inputs.speech_tokens) * models.config.flow.token_mel_ratio,
        rows=1 if options.no_cfg else 2,
        steps=options.flow_steps,
        flow_seconds=report["flow_seconds"],
    )


def token2wav_budget(options: BenchOptions) -> int | None:
    """The streaming keys/values budget the bench's Token2Wav ran with."""
    if options.max_reuse_mb is not None:
        return int(options.max_reuse_mb * 1e6)
    return DEFAULT_MAX_REUSE_BYTES


def _report(
    options: BenchOptions,
    models: _Models,
    preset: PresetResult,
    inputs: _Inputs,
    timing: UtteranceTiming,
    clock: StageClock,
    load_seconds: float,
    weights_bytes: int,
    placement: Placement,
) -> dict[str, Any]:
    config = models.config
    llm_seconds = timing.prefill_seconds + timing.decode_seconds
    audio_seconds = timing.audio_samples / config.sample_rate
    flow_seconds = clock.flow_seconds
    vocoder_seconds = max(0.0, clock.token2wav_seconds - flow_seconds)
    peak_rss = peak_rss_bytes()
    report: dict[str, Any] = {
        "model": models.description,
        "device": str(placement.device),
        "dtype": str(placement.dtype).removeprefix("torch."),
        "preset": preset.preset,
        "preset_label": preset.label,
        "stream": options.stream,
        "seed": options.seed,
        "prompt_seconds": options.prompt_seconds,
        "audio_seconds": options.audio_seconds,
        "prompt_speech_tokens": int(inputs.prompt.speech_token.shape[1]),
        "prompt_text_tokens": len(inputs.prompt_text),
        "text_tokens": len(inputs.text),
        "lm_prefix_positions": timing.prefix_positions,
        "speech_tokens": inputs.speech_tokens,
        "load_seconds": load_seconds,
        "prefill_seconds": timing.prefill_seconds,
        "first_token_seconds": timing.first_token_seconds,
        "llm_seconds": llm_seconds,
        "llm_tokens_per_second": inputs.speech_tokens / llm_seconds,
        "decode_tokens_per_second": inputs.speech_tokens / timing.decode_seconds,
        "flow_seconds": flow_seconds,
        "vocoder_seconds": vocoder_seconds,
        "other_seconds": max(0.0, timing.total_seconds - llm_seconds - flow_seconds - vocoder_seconds),
        "total_seconds": timing.total_seconds,
        # CPU time / (wall time x threads): well under 1 on CPU means other work shared the cores.
        "cpu_share": timing.cpu_seconds / (timing.total_seconds * torch.get_num_threads()),
        "audio_out_seconds": audio_seconds,
        "real_time_factor": timing.total_seconds / audio_seconds if audio_seconds else float("inf"),
        "first_chunk_seconds": timing.first_chunk_seconds,
        "voice_prepare_seconds": timing.voice_prepare_seconds,
        "voice_cache_bytes": timing.voice_cache_bytes,
        "stream_prefix_peak_bytes": timing.stream_prefix_peak_bytes,
        "max_reuse_bytes": token2wav_budget(options) if options.stream else None,
        "chunks": timing.chunks,
        "peak_rss_bytes": peak_rss,
        "weights_bytes": weights_bytes,
        "peak_rss_over_weights": peak_rss / weights_bytes,
        "quantized_linears": preset.quantized_linears,
        "deviation": None if preset.deviation is None else preset.deviation.to_dict(),
        "flow_steps": options.flow_steps,
        "no_cfg": options.no_cfg,
        "flow_label": flow_options_label(options.flow_steps, options.no_cfg),
        "flow_deviation": None,  # set by run_bench when the flow options are not the exact path
        "machine": {},
    }
    if placement.device.type == "cuda":
        report["peak_gpu_bytes"] = int(torch.cuda.max_memory_allocated(placement.device))
    return report
