"""The compiled tanh-GELU of the DiT's feed-forward: torch's values to a few ulp over many values and
their tails, the same special values, inputs it does not take through torch, the placed flow uses it
and keeps the official mels (the fast preset's int8 DiT too), and the switch that turns it off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cosyserve.engine import native_int8
from cosyserve.engine.device import Placement
from cosyserve.engine.loading import load_flow, place_flow
from cosyserve.engine.native_activation import CompiledGelu, native_gelu_available, use_compiled_gelu
from cosyserve.engine.quantize import _dit_selected, quantize_linears
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity.flow import CASES, MEL_TOLERANCE

pytestmark = pytest.mark.skipif(
    not (native_int8.cpu_supports_kernel(kernel="gemv_avx2") and native_int8.compiler() is not None),
    reason="needs avx2 and fma, and gcc",
)


# Counts: fewer than 8 (the tail alone), a tail after whole vectors, more than one task (8192 values).
@pytest.mark.parametrize("count", [5, 8, 1003, 3 * 8192 + 5])
@torch.inference_mode()
def test_values_are_torch_s_to_a_few_ulp(count: int) -> None:
    generator = torch.Generator().manual_seed(count)
    x = torch.randn(count, generator=generator) * 4
    got, expected = CompiledGelu()(x), F.gelu(x, approximate="tanh")
    assert got.shape == x.shape and got.data_ptr() != x.data_ptr()
    exact = F.gelu(x.double(), approximate="tanh")
    # measured over 3.3M values of N(0, 9): 5.2e-7 from float64 (torch's own 4.3e-7), 4.8e-7 from torch
    assert float((got.double() - exact).abs().max()) <= 2e-6
    assert float((got - expected).abs().max()) <= 2e-6


@torch.inference_mode()
def test_special_values_are_torch_s() -> None:
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, -200.0, 200.0, -1e-30, 1e-30])
    got, expected = CompiledGelu()(x), F.gelu(x, approximate="tanh")
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.nan_to_num(), expected.nan_to_num())
    numbers = ~expected.isnan()
    assert torch.equal(got.signbit()[numbers], expected.signbit()[numbers])


def test_inputs_it_does_not_take_go_through_torch() -> None:
    gelu = CompiledGelu()
    x = torch.randn(6, 10, dtype=torch.float64)
    torch.testing.assert_close(gelu(x), F.gelu(x, approximate="tanh"), rtol=0, atol=0)
    strided = torch.randn(10, 6).t()
    torch.testing.assert_close(gelu(strided), F.gelu(strided, approximate="tanh"), rtol=0, atol=0)
    leaf = torch.randn(4, requires_grad=True)
    gelu(leaf).sum().backward()  # gradients flow: torch's GELU computed it
    assert leaf.grad is not None


@torch.inference_mode()
def test_the_placed_flow_uses_it_and_keeps_the_official_mels(tiny_dir: Path) -> None:
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    flow = place_flow(load_flow(model_dir), Placement(torch.device("cpu")))
    blocks = flow.decoder.estimator.transformer_blocks
    assert all(isinstance(block.ff.ff[0][1], CompiledGelu) for block in blocks)
    plain = load_flow(model_dir)
    golden = np.load(tiny_dir / "flow.npz")
    inputs = (
        torch.from_numpy(golden["token"]).long()[None],
        torch.from_numpy(golden["prompt_token"]).long()[None],
        torch.from_numpy(golden["prompt_feat"]).float()[None],
        torch.from_numpy(golden["embedding"]).float()[None],
    )
    for streaming, finalize in CASES:
        mel = flow.inference(*inputs, streaming=streaming, finalize=finalize)[0]
        reference = plain.inference(*inputs, streaming=streaming, finalize=finalize)[0]
        key = f"mel_stream{int(streaming)}_final{int(finalize)}"
        assert np.abs(mel.numpy() - golden[key]).max() <= MEL_TOLERANCE
        # measured: 7.2e-7 to 9.5e-7 (the tiny flow), as far as torch's GELU lies from the golden mels
        assert float((mel - reference).abs().max()) <= 1e-5
    # The fast preset's int8 DiT replaces the products only: the compiled GELU stays.
    assert quantize_linears(flow, _dit_selected) > 0
    assert all(isinstance(block.ff.ff[0][1], CompiledGelu) for block in blocks)


def test_switched_off_torch_s_gelu_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    native_int8.forget_loading()
    monkeypatch.setenv("COSYSERVE_NATIVE_KERNELS", "0")
    try:
        model = nn.Sequential(nn.Linear(4, 4), nn.GELU(approximate="tanh"), nn.GELU())
        assert not native_gelu_available() and use_compiled_gelu(model) == 0
        assert isinstance(model[1], nn.GELU)
    finally:
        monkeypatch.delenv("COSYSERVE_NATIVE_KERNELS")
        native_int8.forget_loading()
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU(approximate="tanh"), nn.GELU())
    assert use_compiled_gelu(model) == 1  # the exact GELU (erf) is not the kernel's function
    assert isinstance(model[1], CompiledGelu) and isinstance(model[2], nn.GELU)
