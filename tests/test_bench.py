"""`cosyserve bench`: the full-size random architecture, the measurement, the report and the CLI.

Behaviour and completeness only: no test here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
import torch

from cosyserve.bench import cli as bench_cli
from cosyserve.bench.full_random import (
    SCALES,
    build_random_models,
    full_size_config,
    tiny_config,
)
from cosyserve.bench.machine import cpu_model_and_flags, peak_rss_bytes
from cosyserve.bench.report import render
from cosyserve.bench.roofline import decode_bytes_per_token, flow_flops
from cosyserve.bench.runner import BenchOptions, run_bench
from cosyserve.engine.int8 import int8_available
from cosyserve.engine.quantize import PRESETS
from cosyserve.errors import InputError
from cosyserve.model.flow import DEFAULT_N_TIMESTEPS, CausalFlow
from cosyserve.model.hift import HiFTVocoder
from cosyserve.model.speech_lm import SpeechLM
from cosyserve.modeldir.model_dir import ModelDir

# Every field of the JSON report; numbers must be finite where present.
REPORT_FIELDS = {
    "model", "device", "dtype", "preset", "preset_label", "stream", "seed",
    "prompt_seconds", "audio_seconds", "prompt_speech_tokens", "prompt_text_tokens", "text_tokens",
    "lm_prefix_positions", "speech_tokens", "load_seconds", "prefill_seconds", "first_token_seconds",
    "llm_seconds", "llm_tokens_per_second", "decode_tokens_per_second", "flow_seconds", "vocoder_seconds",
    "other_seconds", "total_seconds", "cpu_share", "audio_out_seconds", "real_time_factor",
    "first_chunk_seconds", "voice_prepare_seconds", "chunks", "peak_rss_bytes", "weights_bytes",
    "peak_rss_over_weights", "quantized_linears", "deviation", "machine",
    "flow_steps", "no_cfg", "flow_label", "flow_deviation",
    "voice_cache_bytes", "stream_prefix_peak_bytes", "max_reuse_bytes", "efficiency",
    "dtypes", "engine_options", "concurrent", "cold_start_seconds", "lm_kernels", "quality_seconds",
    "matmul_speed", "waveform_deviation", "bfloat16_parts",
}  # fmt: skip
COLD_START_FIELDS = {"imports", "load", "place", "calibration", "preset", "first_synthesis", "ready"}
MACHINE_FIELDS = {
    "cpu",
    "cpu_flags",
    "cpu_count",
    "threads",
    "torch",
    "python",
    "load_average",
    "load_average_at_start",
}
DEVIATION_FIELDS = {"max_abs_logp", "max_abs_prob", "top1_agreement", "max_abs_mel", "mean_abs_mel"}
FLOW_DEVIATION_FIELDS = {"flow_steps", "no_cfg", "max_abs_mel", "mean_abs_mel", "against", "probe"}
# One thread: tiny matrices gain nothing from more, and a busy test machine makes them slower.
TINY = {"scale": "tiny", "prompt_seconds": 1.0, "audio_seconds": 2.0, "threads": 1}


@pytest.fixture(autouse=True)
def _restore_threads():
    """The bench sets torch's thread count for the process; give other tests back what they had."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _assert_finite_numbers(report: dict) -> None:
    for key, value in report.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert math.isfinite(value), key


def test_full_size_config_is_the_real_architecture() -> None:
    config = full_size_config()
    with torch.device("meta"):  # shapes only
        counts = [
            sum(p.numel() for p in module.parameters())
            for module in (SpeechLM(config.llm), CausalFlow(config.flow), HiFTVocoder(config.hift))
        ]
    assert counts == [506_148_480, 332_257_088, 20_765_597]
    assert (config.llm.qwen2.hidden_size, config.llm.qwen2.num_hidden_layers) == (896, 24)
    assert (config.flow.dit.dim, config.flow.dit.depth, config.flow.dit.static_chunk_size) == (1024, 22, 50)
    assert config.hift.base_channels == 512


def test_tiny_scale_equals_the_parity_model_config(tiny_dir: Path) -> None:
    """The embedded numbers have the YAML's structure: shrunk, they give exactly the tiny fixture's config."""
    assert tiny_config() == ModelDir.open(tiny_dir / "model", require_onnx=False).config


def test_random_models_are_seeded_with_real_buffers() -> None:
    models = build_random_models("tiny", seed=3)
    again = build_random_models("tiny", seed=3)
    other = build_random_models("tiny", seed=4)
    config = tiny_config()
    defaults = (SpeechLM(config.llm), CausalFlow(config.flow), HiFTVocoder(config.hift))
    for built, same, different, default in zip(
        (models.llm, models.flow, models.hift),
        (again.llm, again.flow, again.hift),
        (other.llm, other.flow, other.hift),
        defaults,
        strict=True,
    ):
        params = dict(built.named_parameters())
        assert all(torch.isfinite(p).all() and p.abs().sum() > 0 for p in params.values())
        assert all(torch.equal(p, q) for p, q in zip(params.values(), same.parameters(), strict=True))
        assert not all(
            torch.equal(p, q) for p, q in zip(params.values(), different.parameters(), strict=True)
        )
        assert not built.training and not any(p.requires_grad for p in params.values())
        # Rotary tables, windows: computed as in a normal construction, never left uninitialised.
        for (name, buffer), (_, expected) in zip(built.named_buffers(), default.named_buffers(), strict=True):
            assert torch.equal(buffer, expected), name
    assert models.weight_bytes() == sum(
        t.numel() * 4 for m in defaults for t in (*m.parameters(), *m.buffers())
    )


def test_bench_reports_every_field() -> None:
    report = run_bench(BenchOptions(**TINY))
    assert set(report) == REPORT_FIELDS
    assert set(report["machine"]) >= MACHINE_FIELDS
    _assert_finite_numbers(report)
    assert report["speech_tokens"] == 50
    assert report["prompt_speech_tokens"] == 25
    assert report["audio_out_seconds"] == pytest.approx(2.0)
    assert report["first_chunk_seconds"] is None and report["deviation"] is None
    assert (
        report["voice_cache_bytes"] is report["stream_prefix_peak_bytes"] is report["max_reuse_bytes"] is None
    )
    assert report["flow_deviation"] is None and (report["flow_steps"], report["no_cfg"]) == (10, False)
    assert report["preset"] == "exact" and report["quantized_linears"] == {}
    assert report["peak_rss_bytes"] >= report["weights_bytes"] > 0
    parts = report["llm_seconds"] + report["flow_seconds"] + report["vocoder_seconds"]
    assert parts <= report["total_seconds"] * 1.001 + 1e-3
    assert report["flow_seconds"] > 0 and report["vocoder_seconds"] > 0
    cold = report["cold_start_seconds"]
    assert set(cold) == COLD_START_FIELDS and cold["imports"] > 0 and cold["first_synthesis"] > 0
    assert cold["ready"] == pytest.approx(cold["imports"] + report["load_seconds"])
    assert report["lm_kernels"] == dict.fromkeys(("qkv", "o", "gate_up", "down", "llm_decoder"), "linear")
    found = report["efficiency"]
    assert found["limits"]["memory_gb_s"] > 0 and found["limits"]["matmul_gflop_s"] > 0
    assert found["decode_gb_s"] > 0 and found["flow_gflop_s"] > 0
    assert "real-time factor" in render(report) and "machine limits" in render(report)
    assert report["quality_seconds"] > 0 and "quality checks" in render(report)
    json.dumps(report)  # JSON-ready


def test_streaming_fast_bench_reports_latency_and_deviation() -> None:
    streaming = {**TINY, "prompt_seconds": 3.0, "audio_seconds": 3.0}  # the prompt fills 2 flow chunks
    report = run_bench(BenchOptions(**streaming, stream=True, preset="fast"))
    _assert_finite_numbers(report)
    assert report["stream"] and report["chunks"] >= 2
    assert 0 < report["first_chunk_seconds"] < report["total_seconds"]
    assert report["audio_out_seconds"] == pytest.approx(3.0)
    linears = report["quantized_linears"]  # the vocoder's convolutions too where bfloat16 was chosen
    assert linears["llm"] == 14 and set(linears) <= {"llm", "flow", "vocoder"}
    # Per DiT block: six bfloat16 linears (the time modulation stays float32), or seven int8 ones.
    assert linears["flow"] == (12 if report["bfloat16_parts"]["dit"] else 14)
    # What chose the bfloat16 parts: only where the CPU has units for them and they measured faster.
    assert {"float32_gflops", "bfloat16_gflops", "int8_gflops", "units", "use_bfloat16"} <= set(
        report["matmul_speed"]
    )
    assert set(report["bfloat16_parts"]) == {"dit", "prefill", "vocoder", "attention"}
    assert report["bfloat16_parts"]["vocoder"] == ("vocoder" in linears)
    wav = report["waveform_deviation"]  # the preset's probe mel and the exact one through the vocoder
    assert math.isfinite(wav["max_abs_wav"]) and wav["max_abs_wav"] >= wav["mean_abs_wav"] >= 0
    assert "waveform" in render(report) and "signal to difference" in render(report)
    deviation = report["deviation"]
    assert set(deviation) >= DEVIATION_FIELDS
    assert all(math.isfinite(deviation[key]) and deviation[key] >= 0 for key in DEVIATION_FIELDS)
    text = render(report)
    assert "deviation from exact" in text and "first audio chunk" in text and "NOT bit-exact" in text
    assert 0 < report["voice_cache_bytes"] < report["stream_prefix_peak_bytes"] <= report["max_reuse_bytes"]
    assert "flow keys/values kept for reuse" in text
    # Streaming flow passes are not one-shot passes: no flow efficiency, decoding's is still there.
    assert report["efficiency"]["flow_gflop_s"] is None and report["efficiency"]["decode_gb_s"] > 0


def test_streaming_budget_option_limits_the_kept_keys_and_values() -> None:
    """--max-reuse-mb 0: the stream keeps no flow keys/values of its own (the voice's are shared)."""
    streaming = {**TINY, "prompt_seconds": 3.0, "audio_seconds": 3.0}
    options = BenchOptions(**streaming, stream=True, warmup=False, max_reuse_mb=0)
    report = run_bench(options)
    assert report["max_reuse_bytes"] == 0 and report["chunks"] >= 2
    assert report["stream_prefix_peak_bytes"] == report["voice_cache_bytes"] > 0
    with pytest.raises(InputError, match="max-reuse-mb"):
        run_bench(BenchOptions(**TINY, stream=True, max_reuse_mb=-1))


def test_bench_on_a_model_directory(tiny_dir: Path) -> None:
    report = run_bench(
        BenchOptions(
            model=str(tiny_dir / "model"), prompt_seconds=1.0, audio_seconds=1.0, threads=1, warmup=False
        )
    )
    assert report["model"] == str(tiny_dir / "model")
    assert report["speech_tokens"] == 25


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (BenchOptions(prompt_seconds=0), "prompt-seconds"),
        (BenchOptions(audio_seconds=-1), "audio-seconds"),
        (BenchOptions(threads=0), "threads"),
        (BenchOptions(model="/nonexistent/model"), "not a directory"),
        (BenchOptions(preset="turbo"), "unknown preset"),
        (BenchOptions(device="tpu"), "device"),
    ],
)
def test_bad_options_raise_input_error(options: BenchOptions, message: str) -> None:
    with pytest.raises(InputError, match=message):
        run_bench(options)


def test_cli_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="cosyserve")
    bench_cli.add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "bench",
            "--scale",
            "tiny",
            "--prompt-seconds",
            "1",
            "--audio-seconds",
            "1",
            "--json",
            "--threads",
            "1",
        ]
    )
    assert args.func(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == REPORT_FIELDS
    assert report["machine"]["threads"] == 1


def test_cli_choices_match_the_engine() -> None:
    assert bench_cli.PRESETS == PRESETS
    assert bench_cli.SCALES == SCALES
    assert bench_cli.DEFAULT_FLOW_STEPS == DEFAULT_N_TIMESTEPS


def test_flow_options_report_their_deviation_on_the_demo_model(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="cosyserve")
    bench_cli.add_bench_parser(parser.add_subparsers(dest="command"))
    common = ["bench", "--model", "demo", "--prompt-seconds", "1", "--audio-seconds", "1", "--threads", "1"]
    args = parser.parse_args([*common, "--flow-steps", "4", "--no-cfg", "--no-warmup", "--json"])
    assert args.func(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == REPORT_FIELDS
    assert (report["flow_steps"], report["no_cfg"]) == (4, True)
    assert "NOT the exact path" in report["flow_label"]
    deviation = report["flow_deviation"]
    assert set(deviation) == FLOW_DEVIATION_FIELDS
    assert math.isfinite(deviation["max_abs_mel"]) and deviation["max_abs_mel"] > 0
    assert deviation["mean_abs_mel"] <= deviation["max_abs_mel"]
    assert report["deviation"] is None  # the exact preset: only the flow options deviate
    text = render(report)
    assert "flow options' deviation" in text and "4 Euler steps, no CFG" in text


def test_flow_options_deviation_with_the_fast_preset_and_skipping() -> None:
    report = run_bench(BenchOptions(**TINY, flow_steps=6, preset="fast", warmup=False))
    flow_deviation = report["flow_deviation"]
    assert flow_deviation["flow_steps"] == 6 and "fast preset" in flow_deviation["against"]
    assert report["deviation"] is not None
    skipped = run_bench(BenchOptions(**TINY, no_cfg=True, deviation=False, warmup=False))
    assert skipped["flow_deviation"] is None and skipped["no_cfg"]
    assert "not measured" in render(skipped)
    with pytest.raises(InputError, match="flow-steps"):
        run_bench(BenchOptions(**TINY, flow_steps=0))


def test_machine_info_helpers(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: Test CPU\nflags\t\t: fpu avx2 fma avx512f avx512_vnni\n")
    assert cpu_model_and_flags(cpuinfo) == ("Test CPU", ["avx2", "fma", "avx512f", "avx512_vnni"])
    assert cpu_model_and_flags(tmp_path / "missing")[1] == []
    assert peak_rss_bytes() > 0


def test_roofline_counts_the_full_size_work() -> None:
    """Bytes one decode step reads and operations of the one-shot flow, for the real architecture."""
    config = full_size_config()
    with torch.device("meta"):
        llm, flow = SpeechLM(config.llm), CausalFlow(config.flow)
    per_layer = 2 * 896 * 896 + 2 * 896 * 128 + 3 * 896 * 4864  # q, o; k, v; gate, up, down
    assert decode_bytes_per_token(llm) == 4 * (24 * per_layer + 896 * 6761)
    per_frame = 22 * (4 * 1024 * 1024 + 2 * 1024 * 2048)  # q, k, v, out; two feed-forward products
    attention = 22 * 16 * 2 * 64 * 800 * 800  # per head: scores and weighted sum over 800 frames
    assert flow_flops(flow, frames=800, rows=2, steps=10) == 2 * 2 * 10 * (per_frame * 800 + attention)


def test_roofline_counts_each_packed_layout_s_own_bytes() -> None:
    """Decoding reads what the layout holds: 4 bytes a weight in float32 layouts, 2 in float16, 1 in
    int8 (a packed int8 product holds an Int8Linear: counted once)."""
    from cosyserve.engine.lm_layout import PRODUCTS, pack_speech_lm

    config = tiny_config()
    weights = decode_bytes_per_token(SpeechLM(config.llm)) // 4  # float32: 4 bytes a weight
    kernels = {"exact": ("transposed", 4), "fast": ("fp16", 2)}
    if int8_available():
        kernels["int8"] = ("int8", 1)
    for preset, (kernel, width) in kernels.items():
        llm = SpeechLM(config.llm)
        chosen = dict.fromkeys(PRODUCTS, kernel)
        chosen["llm_decoder"] = "transposed"
        pack_speech_lm(llm, "exact" if preset == "exact" else "fast", kernels=chosen)
        decoder = config.llm.decoder_size * config.llm.llm_output_size
        assert decode_bytes_per_token(llm) == width * (weights - decoder) + 4 * decoder, preset


def test_bench_runs_the_networks_and_paths_the_service_runs(model_dir: ModelDir, monkeypatch) -> None:
    """Issue 21, item 5: the bench placed its own fp16 flow (inv_freq included) and decoded with its own
    loop; it must measure the service's networks (same dtypes for the same placement), its batching
    path for concurrent requests, and rate the flow against the peak of the dtype it computes in."""
    from cosyserve.bench import runner as bench_runner
    from cosyserve.engine.device import Placement
    from cosyserve.engine.pipeline import EngineOptions, SpeechEngine

    placement = Placement(torch.device("cpu"), torch.bfloat16)  # the reduced-precision path, on the CPU
    monkeypatch.setattr(bench_runner, "resolve_placement", lambda device, precision: placement)
    asked: list[tuple[str, int]] = []

    def for_device(device_type: str, concurrency: int) -> EngineOptions:
        asked.append((device_type, concurrency))  # what a GPU gets: batching for concurrent requests
        return EngineOptions(batch_decode=True, max_batch=concurrency, batch_flow=True, decode_window_s=0.05)

    monkeypatch.setattr(bench_runner.EngineOptions, "for_device", staticmethod(for_device))
    report = run_bench(BenchOptions(**{**TINY, "audio_seconds": 1.0}, concurrency=3, deviation=False))
    assert asked == [("cpu", 3)]
    assert report["dtypes"] == SpeechEngine.load(model_dir, placement).dtypes()
    assert report["dtypes"]["flow_rotary_inv_freq"] == "float32" and report["dtype"] == "bfloat16"
    assert report["efficiency"]["limits"]["matmul_dtype"] == "bfloat16"
    concurrent = report["concurrent"]
    assert concurrent["requests"] == 3 and len(concurrent["request_seconds"]) == 3
    assert concurrent["decode_batches"] > 0 and concurrent["decode_rows_per_batch"] > 1
    assert concurrent["flow_batches"] >= 1
    assert "3 at once" in render(report)


def test_bandwidth_buffer_outgrows_the_largest_cache(tmp_path: Path) -> None:
    from cosyserve.bench.roofline import bandwidth_bytes

    for index, size in enumerate(("48K", "2048K", "491520K")):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert bandwidth_bytes(tmp_path) == 2 * 491520 * 1024
    (tmp_path / "index2" / "size").write_text("32768K\n")
    assert bandwidth_bytes(tmp_path) == 256 << 20  # at least 256 MB
    (tmp_path / "index2" / "size").write_text("4G\n")
    assert bandwidth_bytes(tmp_path) == 2 << 30  # at most 2 GB
    assert bandwidth_bytes(tmp_path / "missing") == 256 << 20


def test_stage_clock_counts_streaming_chunk_passes_as_flow() -> None:
    """A stream's reusing chunks run `solve_span`, not `inference`: both are flow time (they were
    counted as vocoder time)."""
    import time as time_module

    from cosyserve.bench.timing import StageClock

    class Decoder:
        def solve(self) -> None:
            time_module.sleep(0.01)

    class Flow:
        def __init__(self) -> None:
            self.decoder = Decoder()

        def inference(self) -> None:
            self.decoder.solve()  # nested: counted once

        def solve_span(self) -> None:
            time_module.sleep(0.01)

    flow, clock = Flow(), StageClock(torch.device("cpu"))
    with clock.timing_flow(flow):  # type: ignore[arg-type]
        flow.solve_span()
        flow.inference()
        flow.decoder.solve()  # a batched pass (engine.flow_batching) calls the decoder alone
    assert 0.03 <= clock.flow_seconds < 0.04 + 0.02
    assert "solve_span" not in vars(flow) and "solve" not in vars(flow.decoder)  # unwrapped afterwards


def test_concurrent_requests_against_the_same_in_a_row_batched_on_the_cpu() -> None:
    """--concurrency N --batch: N at once through the engine's decode and flow batchers on the CPU, and
    the same N one after another, for aggregate throughput and each latency against one alone."""
    options = BenchOptions(**{**TINY, "audio_seconds": 1.0}, concurrency=2, batch=True, deviation=False)
    report = run_bench(options)
    assert report["engine_options"]["batch_decode"] and report["engine_options"]["max_batch"] == 2
    # The batched flow path is on the stage clock too (it once read 0, its time counted as the vocoder's).
    assert report["flow_seconds"] > 0
    concurrent = report["concurrent"]
    assert concurrent["decode_batches"] > 0 and concurrent["flow_batches"] >= 1
    assert len(concurrent["in_a_row_request_seconds"]) == 2
    assert concurrent["in_a_row_seconds"] == pytest.approx(sum(concurrent["in_a_row_request_seconds"]))
    assert concurrent["throughput_vs_in_a_row"] == pytest.approx(
        concurrent["in_a_row_seconds"] / concurrent["wall_seconds"]
    )
    assert concurrent["latency_vs_alone"] > 0
    assert "in a row" in render(report) and "x one alone" in render(report)
