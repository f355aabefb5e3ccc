"""Kernel calibration: what it measures, how it picks, and how its per-machine cache is keyed, reused
and invalidated. Speeds are never asserted (benchmarks do that), only behaviour and numerics."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from cosyserve.engine import calibration as calibration_module
from cosyserve.engine.calibration import (
    Calibration,
    KernelTiming,
    default_calibration_dir,
    machine_key,
    measure_shape,
    pick,
)
from cosyserve.engine.kv_cache import KVCache
from cosyserve.engine.linear_kernels import EXACT_KERNELS, FAST_KERNELS, available_kernels
from cosyserve.engine.lm_layout import PRODUCTS, pack_speech_lm

SMALL = {"rounds": 1, "working_set": 1 << 16}  # a quick measurement: behaviour only


@pytest.fixture(autouse=True)
def _measure_small_matrices(monkeypatch):
    """The test shapes are tiny: let the calibration measure them anyway."""
    monkeypatch.setattr(calibration_module, "MIN_CALIBRATED_BYTES", 0)
    # A busy test machine (and a tick-grained share of a millisecond measurement can exceed 1): see below
    monkeypatch.setattr(calibration_module, "MAX_OTHER_CPU_SHARE", float("inf"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _timing(kernel: str, seconds: float, error: float = 0.0) -> KernelTiming:
    return KernelTiming(kernel, seconds, 1.0 / seconds, error)


def test_exact_pick_keeps_the_plain_layout_unless_another_is_clearly_faster() -> None:
    assert pick((_timing("linear", 1.04), _timing("transposed", 1.0)), "exact") == "linear"
    assert pick((_timing("linear", 1.2), _timing("transposed", 1.0)), "exact") == "transposed"
    assert pick((_timing("onednn", 1.2), _timing("transposed", 1.0)), "exact") == "transposed"
    # both gemm and gemv read the stored layout as it is: the faster of them within the margin
    plain = (_timing("linear", 1.2), _timing("linear_gemv", 1.05), _timing("transposed_gemv", 1.0))
    assert pick(plain, "exact") == "linear_gemv"


def test_fast_pick_prefers_the_closer_kernel_within_the_margin() -> None:
    fp16, int8 = _timing("fp16", 1.08, 3e-4), _timing("int8", 1.0, 1e-2)
    assert pick((fp16, int8), "fast") == "fp16"
    assert pick((_timing("fp16", 1.5, 3e-4), int8), "fast") == "int8"


def test_fast_pick_takes_the_faster_of_two_equally_close_kernels() -> None:
    """fbgemm's int8 product and the VNNI kernel quantise alike: their errors differ by rounding only."""
    int8, vnni = _timing("int8", 1.0, 1.0e-2), _timing("int8_vnni", 0.95, 1.0000001e-2)
    assert pick((int8, vnni), "fast") == "int8_vnni"
    assert pick((_timing("int8", 0.95, 1.0e-2), _timing("int8_vnni", 1.0, 0.99e-2)), "fast") == "int8"


@pytest.mark.parametrize("bias", [True, False])
def test_measure_shape_times_every_kernel_and_reports_its_error(bias: bool) -> None:
    kernels = available_kernels(EXACT_KERNELS + FAST_KERNELS)
    timings = measure_shape(48, 32, bias, kernels, **SMALL)
    assert [t.kernel for t in timings] == list(kernels)
    for timing in timings:
        assert timing.seconds > 0 and timing.gb_s > 0
        # exact layouts: float rounding; float16 weights: ~1e-3; int8 (7-bit activations): ~1e-2
        bound = {"fp16": 2e-3, "int8": 0.06, "int8_vnni": 0.06, "int8_avx2": 0.06}.get(timing.kernel, 1e-6)
        assert timing.relative_error < bound, timing


def test_choices_are_cached_per_machine_and_reused(tmp_path: Path, monkeypatch) -> None:
    first = Calibration(tmp_path, **SMALL)
    choice = first.choose(48, 32, True, "exact", EXACT_KERNELS, "linear")
    assert choice.source == "measured" and choice.kernel in EXACT_KERNELS
    assert first.path is not None and first.path.is_file()
    saved = json.loads(first.path.read_text())
    assert saved["key"]["threads"] == 1 and saved["key"]["torch"] == torch.__version__

    def no_measuring(*args, **kwargs):
        raise AssertionError("a cached shape was measured again")

    monkeypatch.setattr(calibration_module, "measure_shape", no_measuring)
    again = Calibration(tmp_path, **SMALL).choose(48, 32, True, "exact", EXACT_KERNELS, "linear")
    assert again.source == "cached" and again.kernel == choice.kernel
    assert [t.kernel for t in again.timings] == [t.kernel for t in choice.timings]


def test_another_thread_count_or_instruction_cap_is_another_file(tmp_path: Path, monkeypatch) -> None:
    for name in calibration_module.CAP_VARIABLES:  # this process may run capped already
        monkeypatch.delenv(name, raising=False)
    base = Calibration(tmp_path, **SMALL)
    torch.set_num_threads(2)
    assert Calibration(tmp_path, **SMALL).path != base.path
    torch.set_num_threads(1)
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    capped = Calibration(tmp_path, **SMALL)
    assert capped.path != base.path and capped.key["caps"]["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS")
    assert Calibration(tmp_path, **SMALL).path == base.path


def test_a_file_with_another_key_or_garbage_is_measured_again(tmp_path: Path) -> None:
    calibration = Calibration(tmp_path, **SMALL)
    calibration.choose(48, 32, False, "exact", EXACT_KERNELS, "linear")
    assert calibration.path is not None
    data = json.loads(calibration.path.read_text())
    data["key"]["torch"] = "0.0"
    calibration.path.write_text(json.dumps(data))
    assert (
        Calibration(tmp_path, **SMALL).choose(48, 32, False, "exact", EXACT_KERNELS, "x").source == "measured"
    )
    calibration.path.write_text("{not json")
    assert (
        Calibration(tmp_path, **SMALL).choose(48, 32, False, "exact", EXACT_KERNELS, "x").source == "measured"
    )


def test_presets_and_candidate_sets_are_separate_entries(tmp_path: Path) -> None:
    calibration = Calibration(tmp_path, **SMALL)
    exact = calibration.choose(48, 32, False, "exact", EXACT_KERNELS, "linear")
    fast = calibration.choose(48, 32, False, "fast", FAST_KERNELS, "int8")
    assert exact.kernel in EXACT_KERNELS and fast.kernel in FAST_KERNELS
    assert len(json.loads(calibration.path.read_text())["choices"]) == 2  # type: ignore[union-attr]


def test_small_matrices_and_single_candidates_are_never_measured(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(calibration_module, "MIN_CALIBRATED_BYTES", 1 << 20)
    calibration = Calibration(tmp_path, **SMALL)
    assert calibration.choose(48, 32, False, "exact", EXACT_KERNELS, "linear").source == "default"
    monkeypatch.setattr(calibration_module, "MIN_CALIBRATED_BYTES", 0)
    single = calibration.choose(48, 32, False, "exact", ("transposed",), "linear")
    assert single.source == "default" and single.kernel == "transposed"
    assert not any(tmp_path.iterdir())


def test_an_unwritable_cache_still_chooses(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    choice = Calibration(blocker / "sub", **SMALL).choose(48, 32, False, "exact", EXACT_KERNELS, "linear")
    assert choice.source == "measured"


def test_cache_directory_follows_the_cosyserve_cache_root(tmp_path: Path) -> None:
    assert default_calibration_dir({"COSYSERVE_HOME": str(tmp_path)}) == tmp_path / "calibration"
    assert (
        default_calibration_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "cosyserve" / "calibration"
    )
    assert default_calibration_dir({"COSYSERVE_CALIBRATION_DIR": str(tmp_path / "c")}) == tmp_path / "c"
    assert set(machine_key()) >= {"cpu", "cpu_flags_sha", "torch", "threads", "caps"}


@torch.inference_mode()
def test_calibrated_lm_gives_the_same_log_probs_whatever_it_picks(
    model_dir, tmp_path: Path, monkeypatch
) -> None:
    """The calibration only ever chooses among layouts with the same values to float rounding."""
    from cosyserve.engine import lm_layout
    from cosyserve.model.speech_lm import SpeechLM

    monkeypatch.setattr(lm_layout, "MIN_LM_BYTES", 0)  # measure the tiny LM as if it were large
    plain = SpeechLM.from_checkpoint(model_dir.file("llm.pt"), model_dir.config.llm)
    packed = SpeechLM.from_checkpoint(model_dir.file("llm.pt"), model_dir.config.llm)
    report = pack_speech_lm(packed, "exact", Calibration(tmp_path, **SMALL))
    assert set(report.kernels) == set(PRODUCTS)
    assert all(c.source == "measured" for c in report.choices.values())
    embeds = torch.randn(1, 9, plain.hidden_size)
    caches = [KVCache.allocate(plain.config.qwen2, 9) for _ in range(2)]
    torch.testing.assert_close(
        packed(embeds, caches[0].buffer, 0), plain(embeds, caches[1].buffer, 0), atol=1e-5, rtol=0
    )


def test_choices_measured_on_a_busy_machine_are_used_but_not_cached(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(calibration_module, "MAX_OTHER_CPU_SHARE", -1.0)  # always "busy"
    calibration = Calibration(tmp_path, **SMALL)
    busy = calibration.choose(48, 32, False, "exact", EXACT_KERNELS, "linear")
    assert busy.source == "measured" and calibration.unsaved
    assert calibration.choose(48, 32, False, "exact", EXACT_KERNELS, "linear").kernel == busy.kernel
    # never "busy" (a millisecond measurement's tick-grained share of other work can exceed 1)
    monkeypatch.setattr(calibration_module, "MAX_OTHER_CPU_SHARE", float("inf"))
    calibration.choose(64, 32, False, "exact", EXACT_KERNELS, "linear")  # a quiet one is written
    saved = json.loads(calibration.path.read_text())["choices"]  # type: ignore[union-attr]
    assert list(saved) == [f"exact:64x32:{','.join(available_kernels(EXACT_KERNELS))}"]


def test_an_lm_that_fits_in_caches_is_never_measured(tmp_path: Path) -> None:
    """The demo model's LM (a few MB) decodes from caches: no measurement, no cache file, at start-up."""
    from cosyserve.engine.lm_layout import MIN_LM_BYTES, calibrate, decode_weight_bytes
    from cosyserve.model.sizes import full_size_config, tiny_config

    assert decode_weight_bytes(tiny_config().llm) < MIN_LM_BYTES < decode_weight_bytes(full_size_config().llm)
    assert decode_weight_bytes(full_size_config().llm) == 4 * (24 * 14_909_440 + 6761 * 896)
    calibration = Calibration(tmp_path, **SMALL)
    assert calibrate(tiny_config().llm, "exact", calibration) == 0.0
    assert not any(tmp_path.iterdir())


def test_other_work_is_told_from_this_process_own_time(tmp_path: Path) -> None:
    """The busy test reads the machine's busy time minus this process's: a kernel that leaves a thread
    idle (fbgemm's one-row products) is not "other work", another process spinning is."""
    stat = tmp_path / "stat"
    tick = os.sysconf("SC_CLK_TCK")

    def reading(busy_s: float) -> tuple[float, float]:
        stat.write_text(f"cpu  {int(busy_s * tick)} 0 0 1000 0 0 0 0 0 0\ncpu0 0 0 0 0\n", encoding="ascii")
        counters = calibration_module.cpu_counters(stat)
        assert counters is not None
        return counters

    cores = os.cpu_count() or 1
    start = reading(100.0)
    own = start[1]
    # 2 s of wall time; the machine was busy exactly as long as this process ran, then one core more
    alone = (start[0] + 1.0, own + 1.0)
    assert calibration_module.other_cpu_share(start, alone, 2.0) == pytest.approx(0.0, abs=1e-9)  # float sums
    spinning = (start[0] + 1.0 + 2.0, own + 1.0)
    assert calibration_module.other_cpu_share(start, spinning, 2.0) == pytest.approx(1 / cores)
    assert calibration_module.cpu_counters(tmp_path / "missing") is None
    assert calibration_module.other_cpu_share(None, alone, 2.0) is None
