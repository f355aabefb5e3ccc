"""Rendering a bench report (the dict `run_bench` returns) for people; `--json` prints the dict itself."""

from __future__ import annotations

import json
from typing import Any

GB = 1e9


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=False)


def render(report: dict[str, Any]) -> str:
    """A short table: the setup, one line per stage, the headline figures, memory, machine, deviation."""
    machine = report["machine"]
    mode = "streaming" if report["stream"] else "non-streaming"
    lines = [
        f"cosyserve bench: {report['model']}, {report['device']} {report['dtype']}, "
        f"{machine['threads']} thread{'' if machine['threads'] == 1 else 's'}, {mode}",
        f"preset: {report['preset_label']}; flow: {report['flow_label']}",
        f"input: {report['prompt_seconds']:g} s prompt ({report['prompt_speech_tokens']} speech tokens), "
        f"{report['text_tokens']} text tokens -> {report['speech_tokens']} speech tokens "
        f"({report['audio_out_seconds']:.2f} s of audio; EOS ignored); "
        f"LM prefix {report['lm_prefix_positions']} positions",
        "",
        f"  {'stage':<22}{'seconds':>9}",
        _row("load / build", report["load_seconds"]),
        _row(
            "LLM prefill",
            report["prefill_seconds"],
            f"first token after {report['first_token_seconds']:.2f} s",
        ),
        _row(
            "LLM total",
            report["llm_seconds"],
            f"{report['llm_tokens_per_second']:.1f} tokens/s "
            f"({report['decode_tokens_per_second']:.1f} tokens/s decoding alone)",
        ),
        _row("flow", report["flow_seconds"], _flow_note(report)),
        _row(
            "vocoder", report["vocoder_seconds"], "with the streaming bookkeeping" if report["stream"] else ""
        ),
        _row("other", report["other_seconds"]),
        _row(
            "total",
            report["total_seconds"],
            f"real-time factor {report['real_time_factor']:.2f}; "
            f"this process used {100 * report.get('cpu_share', float('nan')):.0f} % of its threads' time",
        ),
    ]
    if report.get("quality_seconds") is not None:
        share = report["quality_seconds"] / max(report["total_seconds"], 1e-9)
        note = f"{100 * share:.1f} % of total, after it (stand-in speaker encoder)"
        lines.append(_row("quality checks", report["quality_seconds"], note))
    if report["first_chunk_seconds"] is not None:
        lines.append(
            _row("first audio chunk", report["first_chunk_seconds"], "latency from the request start")
        )
    if report["voice_prepare_seconds"] is not None:
        lines.append(
            _row("voice preparation", report["voice_prepare_seconds"], "once per saved voice, not in total")
        )
    lines += [
        "",
        f"peak RSS {report['peak_rss_bytes'] / GB:.2f} GB = {report['peak_rss_over_weights']:.2f} x the "
        f"float32 weights ({report['weights_bytes'] / GB:.2f} GB)"
        + (f"; peak GPU {report['peak_gpu_bytes'] / GB:.2f} GB" if "peak_gpu_bytes" in report else ""),
        *_stream_memory(report),
        *_lm_kernels(report),
        *_cold_start(report),
        *_concurrent(report),
        *_efficiency(report),
        f"machine: {machine['cpu']}; {', '.join(machine['cpu_flags']) or 'no reported flags'}; "
        f"torch {machine['torch']} ({machine['torch_cpu_capability']}); load average "
        f"{_load(machine.get('load_average_at_start', []))} at start, "
        f"{_load(machine['load_average'])} at the end"
        + (f"; GPU {machine['gpu']}" if "gpu" in machine else ""),
    ]
    deviation = report["deviation"]
    if deviation is not None:
        lines += [
            f"deviation from exact (same weights; {deviation['probe']}):",
            f"  max |d logp| {deviation['max_abs_logp']:.3g}, max |d prob| {deviation['max_abs_prob']:.3g}, "
            f"top-1 agreement {100 * deviation['top1_agreement']:.1f} %, "
            f"max |d mel| {deviation['max_abs_mel']:.3g} (mean {deviation['mean_abs_mel']:.3g})",
        ]
    elif report["preset"] != "exact":
        lines.append("deviation from exact: not measured (--no-deviation)")
    wav = report.get("waveform_deviation")
    if wav is not None:
        lines.append(
            f"  waveform ({wav['probe']}): max |d wav| {wav['max_abs_wav']:.3g} "
            f"(mean {wav['mean_abs_wav']:.3g}), signal to difference {wav['wav_snr_db']:.1f} dB"
        )
    flow_deviation = report["flow_deviation"]
    if flow_deviation is not None:
        lines += [
            f"flow options' deviation from the {flow_deviation['against']} ({flow_deviation['probe']}):",
            f"  max |d mel| {flow_deviation['max_abs_mel']:.3g} (mean {flow_deviation['mean_abs_mel']:.3g})",
        ]
    elif report["flow_steps"] != 10 or report["no_cfg"]:
        lines.append("flow options' deviation from exact: not measured (--no-deviation)")
    return "\n".join(lines)


def _load(values: list[float]) -> str:
    return "/".join(str(v) for v in values) or "n/a"


def _row(name: str, seconds: float, note: str = "") -> str:
    return f"  {name:<22}{seconds:>9.2f}" + (f"   {note}" if note else "")


def _chunks(report: dict[str, Any]) -> str:
    return f"{report['chunks']} chunks" if report["stream"] else ""


def _flow_note(report: dict[str, Any]) -> str:
    notes = [_chunks(report)]
    if report["flow_steps"] != 10 or report["no_cfg"]:
        notes.append(report["flow_label"])
    return "; ".join(note for note in notes if note)


def _efficiency(report: dict[str, Any]) -> list[str]:
    found = report.get("efficiency")
    if not found:
        return []
    limits = found["limits"]
    line = (
        f"machine limits: memory {limits['memory_gb_s']:.1f} GB/s, "
        f"{limits.get('matmul_dtype', 'float32')} matrix products "
        f"{limits['matmul_gflop_s']:.0f} GFLOP/s; LLM decoding read weights at "
        f"{found['decode_gb_s']:.1f} GB/s ({100 * found['decode_share_of_bandwidth']:.0f} %)"
    )
    if found["flow_gflop_s"] is not None:
        line += (
            f"; flow {found['flow_gflop_s']:.0f} GFLOP/s effective "
            f"({100 * found['flow_share_of_matmul_peak']:.0f} %)"
        )
    return [line]


def _concurrent(report: dict[str, Any]) -> list[str]:
    found = report.get("concurrent")
    if not found:
        return []
    slowest = max(found["request_seconds"])
    line = (
        f"{found['requests']} at once: {found['audio_seconds']:.1f} s of audio in "
        f"{found['wall_seconds']:.2f} s ({found['realtime_multiple']:.1f} x real time), "
        f"slowest request {slowest:.2f} s"
    )
    if found.get("in_a_row_seconds") is not None:
        line += (
            f"; in a row {found['in_a_row_seconds']:.2f} s: {found['throughput_vs_in_a_row']:.2f} x the "
            f"throughput, slowest latency {found['latency_vs_alone']:.2f} x one alone"
        )
    firsts = found["first_chunk_seconds"]
    if firsts:
        line += f", first chunks after {min(firsts):.2f}-{max(firsts):.2f} s"
    if found["decode_rows_per_batch"] is not None:
        line += f"; {found['decode_rows_per_batch']:.1f} requests per decode step"
    return [line]


def _stream_memory(report: dict[str, Any]) -> list[str]:
    if report.get("stream_prefix_peak_bytes") is None:
        return []
    budget = report.get("max_reuse_bytes")
    return [
        f"flow keys/values kept for reuse: saved voice {report['voice_cache_bytes'] / GB:.2f} GB, the stream "
        f"at most {report['stream_prefix_peak_bytes'] / GB:.2f} GB with it"
        + ("" if budget is None else f" (budget {budget / GB:.2f} GB)")
    ]


def _lm_kernels(report: dict[str, Any]) -> list[str]:
    kernels = report.get("lm_kernels")
    if not kernels:
        return []
    return ["LM products: " + ", ".join(f"{name} {kernel}" for name, kernel in kernels.items())]


def _cold_start(report: dict[str, Any]) -> list[str]:
    cold = report.get("cold_start_seconds")
    if not cold:
        return []
    first = cold["first_synthesis"]
    return [
        f"cold start: imports {cold['imports']:.2f} s, load {cold['load']:.2f} s, "
        f"place {cold['place']:.2f} s (kernel calibration {cold['calibration']:.2f} s), "
        f"preset {cold['preset']:.2f} s -> ready after {cold['ready']:.2f} s; first synthesis (warm-up) "
        + ("not run" if first is None else f"{first:.2f} s")
    ]
