"""The compiled float32 one-row product (`gemv_avx2`): float64's values to float rounding, a row's
values independent of the rows beside it, an RMSNorm inside it as torch computes it, no copy of a
checkpoint's weight, longer inputs through torch, a norm carried when the LM is repacked, and the
switch that turns it off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cosyserve.engine import native_int8
from cosyserve.engine.linear_kernels import EXACT_KERNELS, PackedLinear, available_kernels, pack_linear
from cosyserve.engine.lm_layout import PRODUCTS, pack_speech_lm
from cosyserve.engine.native_f32 import MAX_ROWS, f32_linear, native_f32_available
from cosyserve.errors import InputError
from cosyserve.model.qwen2 import RMSNorm
from cosyserve.model.speech_lm import SpeechLM
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity.llm import LOGP_TOLERANCE, teacher_forced_logp

pytestmark = pytest.mark.skipif(
    not (native_int8.cpu_supports_kernel(kernel="gemv_avx2") and native_int8.compiler() is not None),
    reason="needs avx2 and fma, and gcc",
)


def _case(out: int, inp: int, rows: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, inp, generator=generator)
    return weight, torch.randn(out, generator=generator), torch.randn(rows, inp, generator=generator)


# Shapes: inputs not a multiple of 8 (the masked tail), outputs not a multiple of 8 (the last group),
# one input, the LM's head, and rows up to the kernel's limit.
@pytest.mark.parametrize(
    ("out", "inp", "rows"),
    [(37, 70, 1), (37, 71, 5), (6564, 896, 2), (16, 1, 3), (33, 9, MAX_ROWS), (8, 8, 1)],
)
def test_the_product_is_float64_s_to_rounding_and_a_row_does_not_depend_on_its_neighbours(
    out: int, inp: int, rows: int
) -> None:
    weight, bias, x = _case(out, inp, rows)
    got = f32_linear(x, weight, bias)
    expected = x.double() @ weight.double().t() + bias.double()
    assert float((got.double() - expected).abs().max() / expected.abs().max()) < 5e-6  # measured: <= 2.5e-7
    for row in range(rows):  # bit for bit: batched decoding gives a request what it gets alone
        assert torch.equal(f32_linear(x[row : row + 1], weight, bias), got[row : row + 1])


def test_an_rms_norm_inside_is_torch_s_rms_norm_then_the_product() -> None:
    weight, bias, x = _case(40, 203, 4, seed=1)
    norm = (torch.rand(203) + 0.5, 1e-6)
    expected = F.linear(F.rms_norm(x, (203,), *norm), weight, bias)
    torch.testing.assert_close(f32_linear(x, weight, bias, norm), expected, rtol=1e-5, atol=1e-5)
    longer = torch.randn(MAX_ROWS + 1, 203)  # through torch: the same calls, the same values
    assert torch.equal(
        f32_linear(longer, weight, bias, norm), F.linear(F.rms_norm(longer, (203,), *norm), weight, bias)
    )
    assert torch.equal(f32_linear(longer, weight, None), F.linear(longer, weight))


def test_a_contiguous_checkpoint_weight_is_used_as_it_is_and_a_strided_one_is_copied() -> None:
    weight, bias, x = _case(24, 32, 2)
    packed = pack_linear(weight, bias, "gemv_avx2")
    assert packed.dense_weight()[0].data_ptr() == weight.data_ptr()
    strided = torch.randn(32, 24, generator=torch.Generator().manual_seed(2)).t()  # (24, 32), not contiguous
    copied = pack_linear(strided, bias, "gemv_avx2")
    assert copied.dense_weight()[0].is_contiguous()
    torch.testing.assert_close(copied(x), F.linear(x, strided, bias), rtol=1e-5, atol=1e-5)
    # other dtypes go to torch
    assert f32_linear(x.double(), weight.double(), None).dtype == torch.float64


def _tiny_llm(tiny_dir: Path) -> SpeechLM:
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    return SpeechLM.from_checkpoint(model_dir.file("llm.pt"), model_dir.config.llm)


@torch.inference_mode()
def test_norms_move_into_the_products_and_back_out_when_repacked(tiny_dir: Path) -> None:
    golden = np.load(tiny_dir / "llm.npz")
    lm_input = torch.from_numpy(golden["lm_input"])[None]
    forced = torch.from_numpy(golden["forced_tokens"]).long()
    llm = _tiny_llm(tiny_dir)
    pack_speech_lm(llm, "exact", kernels=dict.fromkeys(PRODUCTS, "gemv_avx2"))
    layer = llm.qwen2.layers[0]
    assert isinstance(layer.input_layernorm, torch.nn.Identity)
    assert isinstance(layer.self_attn.qkv_proj, PackedLinear) and layer.self_attn.qkv_proj.norm is not None
    logp = teacher_forced_logp(llm, lm_input, forced)
    assert np.abs(logp.numpy() - golden["logp"]).max() <= LOGP_TOLERANCE
    # A fast kernel that cannot compute a norm gets it back into the layer: the same LM as packing
    # the loaded model directly.
    pack_speech_lm(llm, "fast", kernels=dict.fromkeys(PRODUCTS, "fp16"))
    assert isinstance(layer.input_layernorm, RMSNorm) and isinstance(layer.post_attention_layernorm, RMSNorm)
    direct = _tiny_llm(tiny_dir)
    pack_speech_lm(direct, "fast", kernels=dict.fromkeys(PRODUCTS, "fp16"))
    torch.testing.assert_close(
        teacher_forced_logp(llm, lm_input, forced), teacher_forced_logp(direct, lm_input, forced)
    )


@pytest.fixture
def switched_off(monkeypatch: pytest.MonkeyPatch):
    native_int8.forget_loading()
    monkeypatch.setenv("COSYSERVE_NATIVE_KERNELS", "0")
    yield
    monkeypatch.delenv("COSYSERVE_NATIVE_KERNELS")
    native_int8.forget_loading()


def test_switched_off_it_is_neither_offered_nor_forceable(switched_off, tiny_dir: Path, monkeypatch) -> None:
    assert not native_f32_available() and "gemv_avx2" not in available_kernels(EXACT_KERNELS)
    with pytest.raises(RuntimeError, match="not available"):
        pack_linear(torch.randn(4, 8), None, "gemv_avx2")
    monkeypatch.setenv("COSYSERVE_LM_KERNEL", "gemv_avx2")
    with pytest.raises(InputError, match="not available on this machine"):
        pack_speech_lm(_tiny_llm(tiny_dir), "exact")
