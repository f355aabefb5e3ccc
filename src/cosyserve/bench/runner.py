"""`cosyserve bench`: one timed utterance through the engine the service runs, and optionally several
at once through its batching path.

The networks are placed by `loading.place_networks` and the runners built by
`pipeline.build_runners` with `EngineOptions.for_device(device, concurrency)`: on a GPU the same
precisions (float32 flow weights with the DiT's products in half, float32 vocoder without TF32), the
CUDA-graph decode path for one request and the batching path for several. The utterance itself:
`bench.utterance`.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cosyserve.bench.cold_start import ColdStart, seconds_since_process_start
from cosyserve.bench.full_random import SCALES, build_random_models, config_for_scale, module_bytes
from cosyserve.bench.machine import load_average, machine_info, peak_rss_bytes
from cosyserve.bench.quality_cost import scoring_seconds
from cosyserve.bench.roofline import MachineLimits, efficiency, measure_limits
from cosyserve.bench.timing import StageClock, UtteranceTiming
from cosyserve.bench.utterance import (
    BenchInputs,
    Progress,
    make_inputs,
    run_concurrent,
    run_utterance,
    warm_up,
)
from cosyserve.bench.waveform import probe_waveform, waveform_deviation
from cosyserve.engine.device import Placement, configure_cpu_threads, resolve_placement
from cosyserve.engine.flow_options import (
    check_flow_options,
    flow_options_label,
    is_exact,
    measure_flow_options,
    probe_mel,
)
from cosyserve.engine.lm_layout import calibrate, current_kernels, default_calibration
from cosyserve.engine.loading import network_dtypes, place_networks
from cosyserve.engine.pipeline import EngineOptions, build_runners
from cosyserve.engine.quantize import PresetResult, apply_preset, check_preset
from cosyserve.engine.speech_lm_runner import SpeechLMRunner
from cosyserve.engine.token2wav import DEFAULT_MAX_REUSE_BYTES, Token2Wav
from cosyserve.errors import InputError
from cosyserve.model.config import CosyVoice3Config
from cosyserve.model.flow import DEFAULT_N_TIMESTEPS, CausalFlow
from cosyserve.model.hift import HiFTVocoder
from cosyserve.model.speech_lm import SpeechLM

__all__ = ["BenchOptions", "Progress", "run_bench", "token2wav_budget"]

MODEL_CHOICES = ("full-random", "demo")  # or a model directory
MAX_CONCURRENCY = 64


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
    precision: str = "auto"  # as the service's: float16 on a GPU, float32 on the CPU
    concurrency: int = 1  # > 1: also run that many utterances at once (the batching path on a GPU)
    batch: bool = False  # batch concurrent requests' LM steps and flows on any device (the CPU too)


@dataclass
class _Models:
    config: CosyVoice3Config
    llm: SpeechLM
    flow: CausalFlow
    hift: HiFTVocoder
    description: str


def run_bench(options: BenchOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Load (or build) the model, place it as the service does, apply the preset, synthesise one
    utterance (and `concurrency` at once when above 1); return the JSON report."""
    progress = progress or Progress()
    load_at_start = load_average()
    _check_options(options)
    placement = resolve_placement(options.device, options.precision)
    check_preset(options.preset, placement.device)
    if placement.device.type == "cpu":
        configure_cpu_threads(options.threads)
    torch.manual_seed(options.seed)

    cold = ColdStart(imports=seconds_since_process_start())
    calibration = default_calibration()
    measured_before = calibration.measured_seconds
    started = time.perf_counter()
    if placement.device.type == "cpu" and options.model == "full-random":
        # Before the weights are built: the measurement's copies never add to the process's peak.
        progress.stage("choosing the LM's kernels (measured once per machine, then cached)")
        calibrate(config_for_scale(options.scale).llm, options.preset, calibration)
    early_calibration = time.perf_counter() - started
    with _loaded_models(options, progress) as models:
        cold.load = time.perf_counter() - started - early_calibration  # building or mapping the weights
        weights_bytes = sum(module_bytes(m) for m in (models.llm, models.flow, models.hift))
        progress.stage("placing the networks")
        models.llm, models.flow, models.hift = place_networks(
            models.llm, models.flow, models.hift, placement, pack_lm=options.preset == "exact"
        )
        load_seconds = time.perf_counter() - started
        preset_started = time.perf_counter()
        preset, flow_deviation, wav_deviation = _apply_options(models, options, placement, progress)
        cold.place = load_seconds - cold.load  # the LM's layouts and their calibration
        cold.preset = time.perf_counter() - preset_started
        cold.calibration = calibration.measured_seconds - measured_before
        engine_options, runner, token2wav = _runners(models, options, placement)
        inputs = make_inputs(
            models.config, options.prompt_seconds, options.audio_seconds, options.seed, placement.device
        )
        if options.warmup:
            progress.stage("warm-up")
            first_started = time.perf_counter()
            warm_up(runner, token2wav, inputs)
            cold.first_synthesis = time.perf_counter() - first_started
        clock = StageClock(placement.device)
        progress.stage("synthesising" + (" (streaming)" if options.stream else ""))
        with clock.timing_flow(models.flow):
            timing = run_utterance(runner, token2wav, models.config, inputs, options.stream, clock, progress)
        report = _report(
            options, models, preset, inputs, timing, clock, load_seconds, weights_bytes, placement
        )
        report["flow_deviation"] = None if flow_deviation is None else flow_deviation.to_dict()
        progress.stage("scoring the take (the quality checks)")
        report["quality_seconds"] = scoring_seconds(
            report["audio_out_seconds"], models.config.sample_rate, inputs.speech_tokens
        )
        report["waveform_deviation"] = wav_deviation  # the preset's audio against the exact flow's
        report["cold_start_seconds"] = cold.to_dict(measured_deviation=options.deviation)
        report["lm_kernels"] = current_kernels(models.llm)
        report["dtypes"] = network_dtypes(models.llm, models.flow, models.hift, placement)
        report["engine_options"] = dataclasses.asdict(engine_options)
        report["concurrent"] = None
        if options.concurrency > 1:
            progress.stage(f"synthesising {options.concurrency} utterances at once")
            report["concurrent"] = run_concurrent(
                runner, token2wav, models.config, inputs, options.stream, options.concurrency, options.seed
            )
        # After the report has read the peak memory, so that these buffers never count in it.
        progress.stage("measuring this machine's memory bandwidth and matrix throughput")
        limits = measure_limits(placement.device, _product_dtype(placement))
        report["efficiency"] = _efficiency(limits, models, inputs, options, report)
        report["machine"] = machine_info(placement.device, load_at_start)
        return report


def _runners(
    models: _Models, options: BenchOptions, placement: Placement
) -> tuple[EngineOptions, SpeechLMRunner, Token2Wav]:
    """The engine options for this run and the runners the service would build with them."""
    engine_options = dataclasses.replace(
        EngineOptions.for_device(placement.device.type, options.concurrency),
        flow_steps=options.flow_steps,
        guidance=not options.no_cfg,
    )
    if options.batch and options.concurrency > 1:
        engine_options = dataclasses.replace(
            engine_options,
            batch_decode=True,
            max_batch=options.concurrency,
            batch_flow=True,
            max_flow_batch=options.concurrency,
            cuda_graph=False,
        )
    budget = {} if options.max_reuse_mb is None else {"max_reuse_bytes": int(options.max_reuse_mb * 1e6)}
    runner, token2wav = build_runners(
        models.llm, models.flow, models.hift, placement, engine_options, models.config.chunk_size, **budget
    )
    return engine_options, runner, token2wav


def _apply_options(
    models: _Models, options: BenchOptions, placement: Placement, progress: Progress
) -> tuple[PresetResult, Any, dict[str, Any] | None]:
    """The preset, the flow options' deviation from the exact path (None when exact), measured in
    the precision the flow runs in, and the preset's waveform deviation (None for exact: the preset's
    probe mel and the exact one, each through the vocoder)."""
    if options.preset != "exact":
        progress.stage(
            f"applying preset {options.preset}"
            + (" and measuring its deviation" if options.deviation else "")
        )
    autocast = torch.autocast(
        placement.device.type, dtype=placement.dtype, enabled=placement.autocast_enabled
    )
    flow_reference = wav_reference = None
    if options.deviation and (options.preset != "exact" or not is_exact(options.flow_steps, options.no_cfg)):
        progress.stage("measuring the exact flow on a probe input, for the deviation from exact")
        with autocast:
            flow_reference = probe_mel(models.flow)  # before the preset: the exact path's weights
            if options.preset != "exact":  # and the exact vocoder's audio of it
                wav_reference = probe_waveform(models.hift, flow_reference)
    preset = apply_preset(models, options.preset, measure=options.deviation, hift=models.hift)
    wav_deviation = None
    if wav_reference is not None:
        with autocast:
            wav_deviation = waveform_deviation(wav_reference, probe_mel(models.flow), models.hift)
    if flow_reference is None or is_exact(options.flow_steps, options.no_cfg):
        return preset, None, wav_deviation
    against = "exact path (10 Euler steps with CFG" + (
        ")" if options.preset == "exact" else f"; measured with the {options.preset} preset applied)"
    )
    with autocast:
        deviation = measure_flow_options(
            flow_reference, models.flow, options.flow_steps, options.no_cfg, against
        )
    return preset, deviation, wav_deviation


def _product_dtype(placement: Placement) -> torch.dtype:
    """The dtype the flow's matrix products run in (the peak to rate them against)."""
    return placement.dtype if placement.autocast_enabled else torch.float32


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
    if not 1 <= options.concurrency <= MAX_CONCURRENCY:
        raise InputError(f"--concurrency {options.concurrency}: use 1 to {MAX_CONCURRENCY}")


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


def _efficiency(
    limits: MachineLimits, models: _Models, inputs: BenchInputs, options: BenchOptions, report: dict[str, Any]
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
    inputs: BenchInputs,
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
        "matmul_speed": preset.matmul,  # fast: float32/bfloat16/int8 speeds here, which chose the below
        "bfloat16_parts": preset.bfloat16,  # fast: DiT, LM prefill, vocoder, DiT attention
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
