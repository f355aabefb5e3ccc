"""The DiT in bfloat16 (`engine.bfloat16_dit`): its linears, its attention and the keys and values a
stream keeps. bfloat16 runs on any CPU (slowly without matrix units), so these pass everywhere."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cosyserve.engine.bfloat16_dit import BFloat16Linear, bfloat16_dit
from cosyserve.engine.flow_stream import continue_flow
from cosyserve.engine.loading import load_flow
from cosyserve.model.flow import CausalFlow
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity import token2wav as token2wav_parity

# Measured: the tiny model's mel moves by 1.3-1.5e-4 of its norm (three token seeds, one-shot and
# streaming, on an Intel Xeon with AMX and with the AVX2 caps of the README: the products accumulate in
# float32 on every CPU); a continued pass against a whole streaming pass by 0-1.2e-5. Dropping one
# bias (the feed-forward's second) moves the mel by 3.7e-3: the bounds sit between.
MEL_RELATIVE = 1e-3
CONTINUED_RELATIVE = 1e-4


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).norm() / expected.norm())


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_bfloat16_linear_is_close_to_float(bias: bool, out_dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=bias)
    x = torch.randn(5, 7, 64)
    expected = linear(x)
    for given in (x, x.bfloat16()):  # float32 or bfloat16 in
        got = BFloat16Linear(linear, out_dtype=out_dtype)(given)
        assert got.dtype == out_dtype and got.shape == expected.shape
        assert _relative(got.float(), expected) < 1e-2


def test_bfloat16_linear_writes_float32_or_bfloat16_only() -> None:
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        BFloat16Linear(nn.Linear(4, 4), out_dtype=torch.float16)


@pytest.fixture
def flows(model_dir: ModelDir) -> tuple[CausalFlow, CausalFlow]:
    """The tiny model's flow in float32, and another copy with its DiT in bfloat16."""
    exact, fast = load_flow(model_dir), load_flow(model_dir)
    replaced = bfloat16_dit(fast.decoder.estimator)
    assert replaced == 6 * len(fast.decoder.estimator.transformer_blocks)
    return exact, fast


@torch.inference_mode()
def test_the_dit_attends_in_bfloat16_and_stays_close(flows, tiny_dir) -> None:
    exact, fast = flows
    estimator = fast.decoder.estimator
    assert estimator.kv_dtype() == torch.bfloat16 and exact.decoder.estimator.kv_dtype() == torch.float32
    block = estimator.transformer_blocks[0]
    assert block.attn.attention_dtype == torch.bfloat16
    # The time modulation and the output projection stay float32.
    assert block.attn_norm.linear.weight.dtype == torch.float32
    assert estimator.proj_out.weight.dtype == torch.float32
    prompt = token2wav_parity.fixture_prompt(tiny_dir)
    tokens = torch.randint(0, exact.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(3))
    args = (tokens, prompt.speech_token, prompt.speech_feat, prompt.embedding)
    for streaming in (False, True):
        expected = exact.inference(*args, streaming=streaming, finalize=True)
        got = fast.inference(*args, streaming=streaming, finalize=True)
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        assert _relative(got, expected) < MEL_RELATIVE


@torch.inference_mode()
def test_a_stream_keeps_bfloat16_keys_and_continues_the_bfloat16_pass(flows, tiny_dir) -> None:
    exact, fast = flows
    prompt = token2wav_parity.fixture_prompt(tiny_dir)
    tokens = torch.randint(0, fast.config.vocab_size, (1, 60), generator=torch.Generator().manual_seed(4))
    args = (prompt.speech_token, prompt.speech_feat, prompt.embedding)
    first = tokens[:, : 25 + fast.lookahead]
    _, prefix = continue_flow(fast, first, *args, None)
    assert {segment.kv.dtype for segment in prefix.segments} == {torch.bfloat16}
    # Half the bytes of float32 keys and values, and the byte count the budget uses says so.
    assert prefix.nbytes < exact.prefix_nbytes(prefix.frames) * 0.6
    assert fast.prefix_nbytes(prefix.frames) < exact.prefix_nbytes(prefix.frames) * 0.6
    mel, prefix = continue_flow(fast, tokens, *args, prefix)
    full = fast.inference(tokens, *args, streaming=True, finalize=False)
    new = min(mel.shape[2], full.shape[2])  # both end at the last frame the tokens fix
    assert new > 0 and torch.isfinite(mel).all()
    # The continued pass and a whole streaming pass differ only by the order of float rounding.
    assert _relative(mel, full[:, :, -new:]) < CONTINUED_RELATIVE


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_packed_or_not_the_products_agree(monkeypatch: pytest.MonkeyPatch, out_dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 128)
    x = torch.randn(2, 9, 64)
    gelu = out_dtype == torch.bfloat16  # the hidden layer's GELU is for bfloat16 outputs
    expected = torch.nn.functional.gelu(linear(x), approximate="tanh") if gelu else linear(x)
    # Packed where oneDNN multiplies bfloat16 (AVX-512 BW/VL/DQ or AVX-NE-CONVERT: every CPU that gets
    # the bfloat16 DiT); on an AVX2-only CPU the same module runs unpacked.
    packed = BFloat16Linear(linear, out_dtype, gelu=gelu)
    got = packed(x)
    assert got.dtype == out_dtype and _relative(got.float(), expected) < 1e-2

    def missing(*args: object) -> None:
        raise RuntimeError("no oneDNN here")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", missing)
    plain = BFloat16Linear(linear, out_dtype, gelu=gelu)
    assert plain.packed is None and "unpacked" in plain.extra_repr()
    assert _relative(plain(x).float(), expected) < 1e-2


def test_gelu_is_for_bfloat16_outputs() -> None:
    with pytest.raises(ValueError, match="GELU"):
        BFloat16Linear(nn.Linear(4, 4), torch.float32, gelu=True)
