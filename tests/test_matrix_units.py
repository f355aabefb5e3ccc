"""bfloat16 products where the CPU has matrix units (`engine.matrix_units`): the measured choice, its
cache, the bfloat16 linear, and the fast preset's DiT in bfloat16 with its deviation from exact."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from cosyserve.engine.calibration import Calibration
from cosyserve.engine.int8 import int8_available
from cosyserve.engine.loading import load_flow, load_speech_lm
from cosyserve.engine.matrix_units import (
    MIN_SPEEDUP,
    BFloat16Linear,
    MatmulSpeed,
    bf16_units,
    matmul_speed,
    measure,
)
from cosyserve.engine.quantize import Int8Linear, apply_preset
from cosyserve.model.flow import CausalFlow
from cosyserve.model.speech_lm import SpeechLM
from cosyserve.modeldir.model_dir import ModelDir


def _fake_gflops(float32: float, bfloat16: float):
    calls: list[torch.dtype] = []

    def gflops(dtype: torch.dtype) -> float:
        calls.append(dtype)
        return float32 if dtype == torch.float32 else bfloat16

    return gflops, calls


def test_a_cpu_without_bf16_units_is_not_measured() -> None:
    gflops, calls = _fake_gflops(100, 800)
    speed = measure((), gflops)
    assert calls == [] and not speed.use_bfloat16
    assert "no bfloat16 matrix units" in speed.describe()
    assert bf16_units(["avx2", "fma"]) == ()
    assert bf16_units(["avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]) == ("amx_bf16", "avx512_bf16")


@pytest.mark.parametrize(
    ("float32", "bfloat16", "chosen"), [(256, 2203, True), (100, 100 * MIN_SPEEDUP, True), (100, 120, False)]
)
def test_bfloat16_only_when_measured_clearly_faster(float32: float, bfloat16: float, chosen: bool) -> None:
    gflops, calls = _fake_gflops(float32, bfloat16)
    speed = measure(("amx_bf16",), gflops)
    assert calls == [torch.float32, torch.bfloat16]
    assert speed.use_bfloat16 is chosen
    assert speed.to_dict()["speedup"] == pytest.approx(bfloat16 / float32)


def test_the_choice_is_cached_per_machine(tmp_path: Path) -> None:
    calibration = Calibration(tmp_path)
    runs: list[int] = []

    def measured() -> MatmulSpeed:
        runs.append(1)
        return MatmulSpeed(250.0, 2000.0, ("amx_bf16",))

    first = matmul_speed(calibration, measured)
    again = matmul_speed(Calibration(tmp_path), measured)
    assert first == again and again.use_bfloat16 and len(runs) == 1
    assert len(list(tmp_path.glob("matmul-*.json"))) == 1
    other = Calibration(tmp_path)
    other.key = {**other.key, "threads": 999}  # another machine key: measured again, another file
    matmul_speed(other, measured)
    assert len(runs) == 2
    assert matmul_speed(Calibration(None), measured) and len(runs) == 3  # no directory: memory only


@pytest.mark.parametrize("bias", [True, False])
@torch.inference_mode()
def test_bfloat16_linear_is_close_to_float(bias: bool) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=bias)
    x = torch.randn(5, 7, 64)
    got = BFloat16Linear(linear)(x)
    expected = linear(x)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert float((got - expected).norm() / expected.norm()) < 1e-2


@dataclass
class _Models:
    llm: SpeechLM
    flow: CausalFlow


@pytest.mark.skipif(not int8_available(), reason="this torch build has no fbgemm int8 kernels")
def test_fast_preset_runs_the_dit_in_bfloat16_where_chosen(tiny_dir: Path) -> None:
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    models = _Models(load_speech_lm(model_dir), load_flow(model_dir))
    chosen = MatmulSpeed(256.0, 2203.0, ("amx_bf16",))
    result = apply_preset(models, "fast", matmul=chosen)
    block = models.flow.decoder.estimator.transformer_blocks[1]
    assert isinstance(block.attn.to_q, BFloat16Linear)
    assert not any(isinstance(m, Int8Linear) for m in models.flow.modules())
    assert result.quantized_linears["flow"] == 14
    assert "DiT bfloat16 linears" in result.label and "8.6x" in result.label
    assert result.matmul is not None and result.matmul["use_bfloat16"] is True
    deviation = result.deviation
    assert deviation is not None and math.isfinite(deviation.max_abs_mel)
    assert deviation.max_abs_mel < 0.5  # close to exact, not garbage
    # The exact flow stays float32: nothing else in it changed dtype.
    assert models.flow.decoder.estimator.proj_out.weight.dtype == torch.float32


@pytest.mark.skipif(not int8_available(), reason="this torch build has no fbgemm int8 kernels")
def test_fast_preset_keeps_int8_where_bfloat16_is_not_faster(tiny_dir: Path) -> None:
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    models = _Models(load_speech_lm(model_dir), load_flow(model_dir))
    result = apply_preset(models, "fast", measure=False, matmul=MatmulSpeed(0.0, 0.0, ()))
    assert isinstance(models.flow.decoder.estimator.transformer_blocks[1].attn.to_q, Int8Linear)
    assert "DiT int8 linears" in result.label and "no bfloat16 matrix units" in result.label
