"""The DiT's attention with bfloat16 products (`engine.native_dit_attention`): as close to the float32
attention as torch's bfloat16 SDPA over batches, heads and tails of queries and keys, strided views
as the DiT passes them; inputs it does not take through SDPA; a DiT with it set stays close to its
float32 output; the fast preset sets it where measured faster with int8 linears, never otherwise.

Where the CPU lacks avx512_bf16 (an AVX2-only EPYC) the kernel never runs: there the tests check that
nothing sets it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from cosyserve.engine.int8 import int8_available
from cosyserve.engine.loading import load_flow, load_speech_lm
from cosyserve.engine.matrix_units import MatmulSpeed
from cosyserve.engine.native_dit_attention import (
    BFloat16Attention,
    bfloat16_attention_available,
    use_bfloat16_attention,
)
from cosyserve.engine.quantize import Int8Linear, apply_preset
from cosyserve.model.dit import DiT
from cosyserve.model.sizes import full_size_config
from cosyserve.modeldir.model_dir import ModelDir

RUNS = bfloat16_attention_available()
needs_kernel = pytest.mark.skipif(not RUNS, reason="needs avx512_bf16 (and gcc)")


def _heads(batch: int, heads: int, frames: int, generator: torch.Generator, scale: float = 1.0):
    """(B, H, T, 64) as the DiT makes them: a view of a (B, T, H * 64) projection."""
    return (torch.randn(batch, frames, heads, 64, generator=generator) * scale).transpose(1, 2)


def _float32(q, k, v):
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


@needs_kernel
@pytest.mark.parametrize(
    ("batch", "heads", "frames_q", "frames_k"),
    [(1, 1, 1, 1), (2, 3, 7, 33), (2, 16, 200, 1000), (2, 16, 800, 800)],  # tails of 8 queries, 32 keys
)
@torch.inference_mode()
def test_as_close_to_float32_as_torch_s_bfloat16_attention(batch, heads, frames_q, frames_k) -> None:
    generator = torch.Generator().manual_seed(frames_q)
    q, k = _heads(batch, heads, frames_q, generator, 3.0), _heads(batch, heads, frames_k, generator, 3.0)
    v = _heads(batch, heads, frames_k, generator)  # scaled scores: peaked rows, the hard case for rounding
    got, expected = BFloat16Attention()(q, k, v), _float32(q, k, v)
    assert got is not None and got.shape == expected.shape == (batch, frames_q, heads * 64)
    torch_bf16 = _float32(q.bfloat16(), k.bfloat16(), v.bfloat16()).float()
    ours, theirs = (got - expected).abs(), (torch_bf16 - expected).abs()
    # Measured on an AMD EPYC with avx512_bf16 (Zen 4): max 0.124 vs torch's 0.123, mean 3.9e-3 vs 4.1e-3
    # (both round q, k, v and the probabilities to bfloat16; the bounds leave room for other kernels).
    assert float(ours.max()) <= 1.5 * float(theirs.max()) + 1e-3
    assert float(ours.mean()) <= 1.25 * float(theirs.mean()) + 1e-4


@needs_kernel
@torch.inference_mode()
def test_what_it_does_not_take_goes_through_sdpa() -> None:
    generator = torch.Generator().manual_seed(0)
    q, k, v = (_heads(1, 2, 9, generator) for _ in range(3))
    kernel = BFloat16Attention()
    assert kernel(q.double(), k.double(), v.double()) is None
    assert kernel(q.bfloat16(), k.bfloat16(), v.bfloat16()) is None
    assert kernel(q[..., :32], k[..., :32], v[..., :32]) is None  # head size 32
    assert kernel(q, k[:, :1], v[:, :1]) is None  # heads differ
    assert kernel(q, k, v[:, :, :4]) is None  # keys and values differ


def _dit(depth: int = 2):
    """A DiT of two full-width blocks (head size 64), random weights."""
    full = full_size_config().flow.dit
    torch.manual_seed(0)
    return DiT(replace(full, depth=depth)).eval()


@needs_kernel
@torch.inference_mode()
def test_a_dit_with_it_set_stays_close_to_float32_and_masked_passes_use_sdpa() -> None:
    dit = _dit()
    generator = torch.Generator().manual_seed(1)
    x, mu, cond = (torch.randn(2, 80, 120, generator=generator) for _ in range(3))
    spks, t = torch.randn(2, 80, generator=generator), torch.tensor([0.3, 0.3])
    reference = dit(x, None, mu, t, spks, cond)
    streamed = dit(x, None, mu, t, spks, cond, streaming=True)  # chunk masks
    assert use_bfloat16_attention(dit) == 2
    got = dit(x, None, mu, t, spks, cond)
    error = float((got - reference).abs().max()) / float(reference.abs().max())
    assert 0 < error < 0.05, error  # bfloat16 rounding, not garbage and not float32
    assert torch.equal(dit(x, None, mu, t, spks, cond, streaming=True), streamed)


def test_nothing_sets_it_where_it_does_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from cosyserve.engine import native_dit_attention

    monkeypatch.setattr(native_dit_attention, "bfloat16_attention_available", lambda: False)
    dit = _dit(depth=1)
    assert native_dit_attention.use_bfloat16_attention(dit) == 0
    assert dit.transformer_blocks[0].attn.kernel is None


@pytest.mark.parametrize(
    ("speed", "chosen"),
    [
        (MatmulSpeed(192, 416, ("avx512_bf16",), int8_gflops=687, attention_float32_ms=34,
                     attention_bfloat16_ms=20), True),  # AMD EPYC Zen 4: int8 linears, faster attention
        (MatmulSpeed(192, 416, ("avx512_bf16",), int8_gflops=687, attention_float32_ms=34,
                     attention_bfloat16_ms=30), False),  # not clearly faster
        (MatmulSpeed(256, 2203, ("amx_bf16",), attention_float32_ms=24,
                     attention_bfloat16_ms=12), False),  # a bfloat16 DiT: its own bfloat16 attention
        (MatmulSpeed(0, 0, ()), False),
    ],
)  # fmt: skip
def test_chosen_by_measurement_only_beside_int8_linears(speed: MatmulSpeed, chosen: bool) -> None:
    assert speed.use_bfloat16_attention is chosen
    assert ("attention 34 vs 20 ms (1.7x)" in speed.describe()) is chosen
    assert speed.to_dict()["use_bfloat16_attention"] is chosen


@needs_kernel
@pytest.mark.skipif(not int8_available(), reason="this torch build has no fbgemm int8 kernels")
def test_the_fast_preset_sets_it_beside_int8_linears_where_measured_faster(tiny_dir: Path) -> None:
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    flow = load_flow(model_dir)
    flow.decoder.estimator = _dit()  # full-width blocks (head size 64); the tiny model's are 16 wide
    models = SimpleNamespace(llm=load_speech_lm(model_dir), flow=flow)
    faster = MatmulSpeed(192, 416, ("avx512_bf16",), int8_gflops=687, attention_float32_ms=34,
                         attention_bfloat16_ms=20)  # fmt: skip
    result = apply_preset(models, "fast", measure=False, matmul=faster)
    block = flow.decoder.estimator.transformer_blocks[0]
    assert isinstance(block.attn.to_q, Int8Linear) and isinstance(block.attn.kernel, BFloat16Attention)
    assert result.bfloat16["attention"] and "int8 linears, 8-bit dynamic activations, bfloat16 attention" in (
        result.label.replace("7-bit", "8-bit")
    )
