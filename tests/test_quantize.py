"""The compute presets: int8 linears, which layers the fast preset converts, and its deviation report."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from cosyserve.engine.linear_kernels import PackedLinear
from cosyserve.engine.loading import load_flow, load_speech_lm
from cosyserve.engine.matrix_units import MatmulSpeed
from cosyserve.engine.quantize import (
    Int8Linear,
    apply_preset,
    check_preset,
    cpu_has_vnni,
    int8_available,
    quantize_linears,
)
from cosyserve.engine.speech_lm_runner import SpeechLMRunner
from cosyserve.errors import InputError
from cosyserve.model.flow import CausalFlow
from cosyserve.model.speech_lm import SpeechLM
from cosyserve.modeldir.model_dir import ModelDir

pytestmark = pytest.mark.skipif(not int8_available(), reason="this torch build has no fbgemm int8 kernels")


@dataclass
class _Models:
    llm: SpeechLM
    flow: CausalFlow


NO_BF16_UNITS = MatmulSpeed(0.0, 0.0, ())


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny matrices: one thread is fastest, and steady on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def models(tiny_dir: Path) -> _Models:
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    return _Models(load_speech_lm(model_dir), load_flow(model_dir))


@pytest.mark.parametrize("reduce_range", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_is_close_to_float(reduce_range: bool, bias: bool) -> None:
    """On this CPU: 7-bit activations everywhere, 8-bit only where VNNI keeps them from saturating."""
    torch.manual_seed(0)
    linear = nn.Linear(96, 40, bias=bias)
    if not reduce_range and not cpu_has_vnni():
        with pytest.raises(InputError, match="VNNI"):
            Int8Linear(linear, reduce_range)
        return
    quantized = Int8Linear(linear, reduce_range)
    for shape in [(7, 96), (2, 5, 96), (1, 1, 96)]:
        x = torch.randn(shape)
        with torch.inference_mode():
            expected, got = linear(x), quantized(x)
        assert got.shape == expected.shape and got.dtype == torch.float32
        relative = (got - expected).norm() / expected.norm()
        assert relative < 0.05


# Run by a child process with fbgemm and ATen capped at AVX2, so the AVX2 family's int8 kernels (no
# VNNI: pairs of products added in int16) are tested on every CPU, AVX-512 ones included.
_AVX2_FAMILY_CHECK = """
import torch
from torch import nn
from cosyserve.engine.quantize import Int8Linear, check_reduce_range, cpu_has_vnni
from cosyserve.errors import InputError
assert not cpu_has_vnni() and check_reduce_range(None) is True
torch.manual_seed(0)
linear = nn.Linear(96, 40)
x = torch.randn(7, 96)
with torch.inference_mode():
    error = (Int8Linear(linear)(x) - linear(x)).norm() / linear(x).norm()
assert error < 0.05, float(error)
try:
    Int8Linear(linear, reduce_range=False)
except InputError:
    print("ok", float(error))
else:
    raise SystemExit("8-bit activations were accepted without VNNI")
"""


def test_int8_on_the_avx2_family_keeps_7_bit_activations() -> None:
    env = dict(os.environ, FBGEMM_ENABLE_INSTRUCTIONS="AVX2", ATEN_CPU_CAPABILITY="avx2")
    done = subprocess.run(
        [sys.executable, "-c", _AVX2_FAMILY_CHECK], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stdout + done.stderr


def test_vnni_needs_the_cpu_flag_and_fbgemm_allowing_it(tmp_path: Path, monkeypatch) -> None:
    with_vnni, without = tmp_path / "vnni", tmp_path / "avx2"
    with_vnni.write_text("flags\t\t: fpu avx2 avx512f avx512_vnni\n")
    without.write_text("flags\t\t: fpu avx2 fma\n")
    monkeypatch.delenv("FBGEMM_ENABLE_INSTRUCTIONS", raising=False)
    assert cpu_has_vnni(str(with_vnni)) and not cpu_has_vnni(str(without))
    for cap, kept in [("AVX2", False), ("AVX512", False), ("AVX512_E1", True), ("unknown", True)]:
        monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", cap)
        assert cpu_has_vnni(str(with_vnni)) is kept


def test_quantize_linears_replaces_only_selected_layers() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 2)))
    count = quantize_linears(model, lambda name: name.startswith("2."), reduce_range=True)
    assert count == 2
    assert isinstance(model[0], nn.Linear)
    assert isinstance(model[2][0], Int8Linear) and isinstance(model[2][1], Int8Linear)
    with torch.inference_mode():
        assert model(torch.randn(3, 8)).shape == (3, 2)


def test_fast_preset_converts_the_llm_and_dit_and_reports_deviation(models: _Models) -> None:
    kept = {
        "embed": models.llm.qwen2.embed_tokens.weight,
        "decoder": models.llm.llm_decoder.weight,
        "proj_out": models.flow.decoder.estimator.proj_out.weight,
    }
    # A CPU without bfloat16 units (on one with them the DiT goes bfloat16: tests/test_matrix_units.py).
    result = apply_preset(models, "fast", matmul=NO_BF16_UNITS)
    # 2 Qwen2 layers x 7 linears; 2 DiT blocks x 7 (modulation, q, k, v, out, 2 feed-forward).
    assert result.quantized_linears == {"llm": 14, "flow": 14}
    # Matrices this small are not calibrated: int8 layers (q/k/v and gate/up fused), as before.
    assert result.lm_kernels == {
        "qkv": "int8",
        "o": "int8",
        "gate_up": "int8",
        "down": "int8",
        "llm_decoder": "linear",
    }
    mlp = models.llm.qwen2.layers[0].mlp
    assert isinstance(mlp.gate_up_proj, PackedLinear) and mlp.gate_up_proj.kernel == "int8"
    assert any(isinstance(m, Int8Linear) for m in mlp.modules())
    assert isinstance(models.flow.decoder.estimator.transformer_blocks[1].attn.to_q, Int8Linear)
    # float32 stays where precision matters: embeddings, the LM output layer, the flow's output.
    assert models.llm.qwen2.embed_tokens.weight is kept["embed"]
    decoder = models.llm.llm_decoder
    assert (
        isinstance(decoder, PackedLinear)
        and decoder.dense_weight()[0].data_ptr() == kept["decoder"].data_ptr()
    )
    assert models.flow.decoder.estimator.proj_out.weight is kept["proj_out"]
    assert "NOT bit-exact" in result.label
    deviation = result.deviation
    assert deviation is not None
    for value in (
        deviation.max_abs_logp,
        deviation.max_abs_prob,
        deviation.max_abs_mel,
        deviation.mean_abs_mel,
    ):
        assert math.isfinite(value) and value >= 0
    assert 0.0 <= deviation.top1_agreement <= 1.0
    assert deviation.max_abs_mel < 0.5  # close to exact, not garbage (measured ~1e-3 on this model)
    assert set(deviation.to_dict()) >= {"max_abs_logp", "max_abs_mel", "probe"}


def test_fast_models_still_generate(models: _Models) -> None:
    apply_preset(models, "fast", measure=False)
    runner = SpeechLMRunner(models.llm)
    tokens = list(runner.generate([1, 2, 3, 151646], seed=0))
    assert tokens and all(0 <= t < models.llm.config.speech_token_size for t in tokens)
    mel = models.flow.inference(
        torch.tensor([tokens[:8]]), torch.tensor([[5, 6]]), torch.randn(1, 4, 80), torch.randn(1, 192)
    )
    assert mel.shape == (1, 80, 16) and torch.isfinite(mel).all()


def test_exact_preset_changes_nothing(models: _Models) -> None:
    before = {name: p for name, p in models.llm.named_parameters()}
    result = apply_preset(models, "exact")
    assert result.deviation is None and result.quantized_linears == {}
    assert all(p is before[name] for name, p in models.llm.named_parameters())
    assert not any(isinstance(m, Int8Linear) for m in models.flow.modules())


def test_preset_errors() -> None:
    with pytest.raises(InputError, match="unknown preset"):
        check_preset("turbo", torch.device("cpu"))
    with pytest.raises(InputError, match="CPU"):
        check_preset("fast", torch.device("cuda"))
    check_preset("exact", torch.device("cuda"))


@pytest.mark.skipif(not int8_available(), reason="this torch build has no fbgemm int8 kernels")
@torch.inference_mode()
def test_fused_int8_qkv_equals_three_int8_linears() -> None:
    """The fast preset fuses each LM layer's q, k and v into one int8 product: same values as three."""
    from cosyserve.bench.full_random import tiny_config
    from cosyserve.model.qwen2 import Attention

    torch.manual_seed(0)
    attention = Attention(tiny_config().llm.qwen2).eval()
    x = torch.randn(3, 5, attention.q_proj.in_features)
    separate = [Int8Linear(p)(x) for p in (attention.q_proj, attention.k_proj, attention.v_proj)]
    attention.fuse_qkv(lambda linear: Int8Linear(linear))
    assert not hasattr(attention, "q_proj") and isinstance(attention.qkv_proj, Int8Linear)
    with pytest.raises(ValueError, match="already fused"):
        attention.fuse_qkv(lambda linear: Int8Linear(linear))
    for got, want in zip(attention._project(x), separate, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
