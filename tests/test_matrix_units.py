"""bfloat16 products where the CPU has matrix units (`engine.matrix_units`): the measured choices, their
cache, the bfloat16 linear and convolution, and the fast preset's DiT, LM prefill and vocoder in
bfloat16 with their deviation from exact. Every speed is injected: these pass on any CPU."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from cosyserve.engine.bfloat16_dit import BFloat16Linear
from cosyserve.engine.calibration import Calibration
from cosyserve.engine.device import Placement
from cosyserve.engine.int8 import int8_available
from cosyserve.engine.linear_kernels import PREFILL_MIN_ROWS, PackedLinear, pack_linear
from cosyserve.engine.loading import load_flow, load_hift, load_speech_lm, network_dtypes
from cosyserve.engine.matrix_units import (
    INT8_MARGIN,
    MIN_SPEEDUP,
    OVERRIDE_ENV,
    BFloat16Conv,
    MatmulSpeed,
    bf16_units,
    bfloat16_override,
    matmul_speed,
    measure,
)
from cosyserve.engine.quantize import Int8Linear, apply_preset
from cosyserve.errors import InputError
from cosyserve.model.flow import CausalFlow
from cosyserve.model.speech_lm import SpeechLM
from cosyserve.modeldir.model_dir import ModelDir

CPU = Placement(torch.device("cpu"), torch.float32)


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
    conv, conv_calls = _fake_gflops(float32, bfloat16)
    speed = measure(("amx_bf16",), gflops, int8=lambda: 0.0, conv=conv, attention=lambda: (24.0, 0.0))
    assert calls == [torch.float32, torch.bfloat16] and conv_calls == calls
    assert speed.attention_float32_ms == 24.0 and not speed.use_bfloat16_attention
    assert speed.use_bfloat16 is chosen and speed.use_bfloat16_conv is chosen
    assert speed.to_dict()["speedup"] == pytest.approx(bfloat16 / float32)


@pytest.mark.parametrize(
    ("int8", "chosen"),
    [(0.0, True), (196.0 / INT8_MARGIN, True), (350.0, False)],  # 350: an AVX-512 BF16 EPYC with VNNI
)
def test_the_dit_stays_int8_where_int8_is_faster_still(int8: float, chosen: bool) -> None:
    speed = MatmulSpeed(86.0, 196.0, ("avx512_bf16",), int8_gflops=int8)
    assert speed.beats_float32 and speed.use_bfloat16 is chosen
    # The LM's prefill: int8 layers follow the same rule; float16 ones (float32's speed on many rows)
    # only need bfloat16 to beat float32; float32 layouts never get a copy.
    assert speed.prefill_in_bfloat16("int8") is chosen and speed.prefill_in_bfloat16("fp16")
    assert not speed.prefill_in_bfloat16("linear")
    assert ("int8 350" in speed.describe()) is (int8 == 350.0)


def test_vocoder_convolutions_follow_their_own_measurement() -> None:
    faster = MatmulSpeed(86.0, 100.0, ("avx512_bf16",), conv_float32_gflops=40.0, conv_bfloat16_gflops=80.0)
    assert faster.use_bfloat16_conv and not faster.use_bfloat16 and "conv 40 vs 80" in faster.describe()
    no_units = MatmulSpeed(86.0, 200.0, (), conv_float32_gflops=40.0, conv_bfloat16_gflops=80.0)
    assert not no_units.use_bfloat16_conv and not no_units.prefill_in_bfloat16("fp16")


def test_the_override_names_parts_or_fails_clearly() -> None:
    assert bfloat16_override({}) is None and bfloat16_override({OVERRIDE_ENV: "auto"}) is None
    assert bfloat16_override({OVERRIDE_ENV: "none"}) == frozenset()
    assert bfloat16_override({OVERRIDE_ENV: "dit, vocoder"}) == {"dit", "vocoder"}
    with pytest.raises(InputError, match="unknown: flow"):
        bfloat16_override({OVERRIDE_ENV: "flow"})


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


def test_the_attention_timings_are_cached_with_the_rest(tmp_path: Path) -> None:
    speed = MatmulSpeed(192.0, 416.0, ("avx512_bf16",), int8_gflops=687.0, attention_float32_ms=34.0,
                        attention_bfloat16_ms=20.0)  # fmt: skip
    matmul_speed(Calibration(tmp_path), lambda: speed)
    again = matmul_speed(Calibration(tmp_path), lambda: MatmulSpeed(1.0, 1.0, ("avx512_bf16",)))
    assert again == speed and again.use_bfloat16_attention


def test_a_cache_from_before_int8_was_measured_is_measured_again(tmp_path: Path) -> None:
    calibration = Calibration(tmp_path)
    matmul_speed(calibration, lambda: MatmulSpeed(250.0, 2000.0, ("amx_bf16",), int8_gflops=900.0))
    (path,) = tmp_path.glob("matmul-*.json")
    old = json.loads(path.read_text())
    del old["format"], old["speed"]["int8_gflops"]  # the first format
    path.write_text(json.dumps(old))
    again = matmul_speed(
        Calibration(tmp_path), lambda: MatmulSpeed(250.0, 2000.0, ("amx_bf16",), int8_gflops=1.0)
    )
    assert again.int8_gflops == 1.0


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
    assert result.quantized_linears["flow"] == 12  # six a block; the time modulation stays float32
    assert "DiT bfloat16 linears" in result.label and "8.6x" in result.label
    assert result.matmul is not None and result.matmul["use_bfloat16"] is True
    # The LM's int8 layers run their prefill in bfloat16 too (int8 was not measured faster).
    assert result.bfloat16 == {"dit": True, "prefill": True, "vocoder": False, "attention": True}
    assert "prefill of qkv/o/gate_up/down bfloat16" in result.label
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


@torch.inference_mode()
def test_prefill_rows_use_the_bfloat16_copy_and_decoding_keeps_its_kernel() -> None:
    if not int8_available():
        pytest.skip("this torch build has no fbgemm int8 kernels")
    torch.manual_seed(0)
    weight, bias = torch.randn(48, 64), torch.randn(48)
    plain = pack_linear(weight, bias, "int8")
    both = pack_linear(weight, bias, "int8", prefill_bfloat16=True)
    one_row = torch.randn(1, 1, 64)
    assert torch.equal(both(one_row), plain(one_row))  # decoding: the int8 kernel, bit for bit
    rows = torch.randn(1, PREFILL_MIN_ROWS, 64)
    expected = rows @ weight.T + bias
    got = both(rows)
    assert got.dtype == torch.float32 and not torch.equal(got, plain(rows))
    assert float((got - expected).norm() / expected.norm()) < 1e-2
    with pytest.raises(ValueError, match="bfloat16 prefill copy"):
        pack_linear(weight, bias, "linear", prefill_bfloat16=True)


@torch.inference_mode()
def test_bfloat16_conv_keeps_float32_in_and_out() -> None:
    torch.manual_seed(0)
    conv = nn.Conv1d(8, 6, 3)
    x = torch.randn(2, 8, 40)
    expected = conv(x)
    got = BFloat16Conv(conv)(x)
    assert got.dtype == torch.float32 and conv.weight.dtype == torch.bfloat16
    assert float((got - expected).norm() / expected.norm()) < 1e-2


@pytest.mark.skipif(not int8_available(), reason="this torch build has no fbgemm int8 kernels")
def test_fast_preset_runs_the_vocoder_convolutions_in_bfloat16_where_chosen(tiny_dir: Path) -> None:
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    models = _Models(load_speech_lm(model_dir), load_flow(model_dir))
    hift = load_hift(model_dir)
    mel = torch.randn(1, 80, 30, generator=torch.Generator().manual_seed(0))
    reference, _ = hift.inference(mel)
    speed = MatmulSpeed(86.0, 196.0, ("avx512_bf16",), int8_gflops=350.0, conv_float32_gflops=40.0,
                        conv_bfloat16_gflops=80.0)  # fmt: skip
    result = apply_preset(models, "fast", measure=False, matmul=speed, hift=hift)
    assert result.bfloat16 == {"dit": False, "prefill": False, "vocoder": True, "attention": False}
    assert "vocoder bfloat16 convolutions" in result.label and "DiT int8" in result.label
    stages, kernels = len(hift.ups), len(hift.config.resblock_kernel_sizes)
    assert result.quantized_linears["vocoder"] == stages + 6 * (stages * kernels + stages)
    assert isinstance(hift.ups[0], BFloat16Conv) and isinstance(hift.resblocks[0].convs1[0], BFloat16Conv)
    assert network_dtypes(models.llm, models.flow, hift, CPU)["vocoder_convolutions"] == "bfloat16"
    # float32 where the pitch and the output's magnitude are set
    assert hift.conv_post.weight.dtype == torch.float32 and hift.conv_pre.weight.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in hift.f0_predictor.parameters())
    layer = models.llm.qwen2.layers[0].mlp.gate_up_proj
    assert isinstance(layer, PackedLinear) and layer.kernel == "int8"
    wav, _ = hift.inference(mel)
    assert wav.dtype == torch.float32 and wav.shape == reference.shape and torch.isfinite(wav).all()
    assert float((wav - reference).abs().max()) < 0.1  # close to exact, not garbage


@pytest.mark.skipif(not int8_available(), reason="this torch build has no fbgemm int8 kernels")
def test_the_override_forces_parts_whatever_was_measured(tiny_dir: Path, monkeypatch) -> None:
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    models = _Models(load_speech_lm(model_dir), load_flow(model_dir))
    monkeypatch.setenv(OVERRIDE_ENV, "dit")
    result = apply_preset(models, "fast", measure=False, matmul=MatmulSpeed(0.0, 0.0, ()), hift=None)
    assert result.bfloat16 == {"dit": True, "prefill": False, "vocoder": False, "attention": True}
    assert "forced by COSYSERVE_BFLOAT16" in result.label
