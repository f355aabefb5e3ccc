"""The DiT in bfloat16 where the CPU multiplies it natively (the fast preset, `matrix_units`).

What runs in bfloat16: every linear of the transformer blocks, the attention (scores, weighted sum and
the keys and values a stream keeps), and the feed-forward's hidden layer (its GELU included). What
stays float32: the residual stream, the norms and their time modulation, the biases of the layers that
write into the residual stream, the input embedding, the output projection and the solver's state.

Why the attention too: on an Intel Xeon with AMX, the DiT's products in bfloat16 take 3 s of a 13.6 s
flow, and float32 attention 5.7 s of the rest (SDPA's flash kernel, 2 x 16 heads x 800 frames: 24 ms a
call in float32, 10 ms in bfloat16; it accumulates in float32 either way). Keeping the hidden layer in
bfloat16 spares a float32 copy of the widest activation and its GELU runs over half the bytes; the
second linear rounds its input to bfloat16 anyway.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosyserve.model.dit import DiT

__all__ = ["BFloat16Linear", "BFloat16LinearGelu", "bfloat16_dit"]

log = logging.getLogger(__name__)

_PACKED_ROWS = 1600  # the rows oneDNN lays the packed weight out for: a one-shot pass's 2 x 800 frames
_SELF_CHECK_TOLERANCE = 0.05  # the packed product against the plain one on the check input (|Δ| of
# values ~1: bfloat16's rounding of the output is 4e-3 there; a wrong layout or epilogue is off by ~1)


class BFloat16Linear(nn.Module):
    """An `nn.Linear` whose product runs in bfloat16 (weights stored so). `x` `(..., in)`, float32 or
    bfloat16 -> `(..., out)` in `out_dtype`: float32 (the bias added in float32, in the same pass as
    the widening) or bfloat16 (for a next step that takes bfloat16, the bias added before rounding)."""

    def __init__(self, linear: nn.Linear, out_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if out_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"a bfloat16 linear writes float32 or bfloat16, not {out_dtype}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.out_dtype = out_dtype
        self.register_buffer("weight", linear.weight.detach().to(torch.bfloat16), persistent=False)
        bias = None if linear.bias is None else linear.bias.detach().to(out_dtype)
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        x = x.to(torch.bfloat16)
        if self.out_dtype == torch.bfloat16:
            return F.linear(x, self.weight, self.bias)
        out = F.linear(x, self.weight)
        # bfloat16 + float32 promotes: widening and bias in one pass over the output.
        return out.float() if self.bias is None else torch.add(self.bias, out)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bfloat16"


class BFloat16LinearGelu(nn.Module):
    """The feed-forward's hidden layer, `gelu_tanh(linear(x))`, in bfloat16: `(..., in)` -> `(..., out)`
    bfloat16. Where oneDNN can, one call with the GELU applied to the float32 accumulator before
    rounding (`torch.ops.mkldnn._linear_pointwise` on a weight packed once, as torch's compiler does):
    torch's own tanh-GELU over the bfloat16 output took as long as the product (3.2 ms of 6.1 ms for
    1600 x 1024 -> 2048 on an Intel Xeon with AMX; fused 3.6 ms). Otherwise, or if the packed product
    disagrees with the plain one on a check input when built, the plain product then GELU."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.plain = BFloat16Linear(linear, out_dtype=torch.bfloat16)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", _packed_or_none(self.plain), persistent=False)
        if self.packed is not None:
            self.plain.weight = None  # the packed copy serves (44 MB less for the full-size DiT)

    def forward(self, x: Tensor) -> Tensor:
        x = x.to(torch.bfloat16)
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.plain.bias, "gelu", [], "tanh")
        return F.gelu(self.plain(x), approximate="tanh")

    def extra_repr(self) -> str:
        fused = "fused" if self.packed is not None else "unfused"
        return f"in_features={self.in_features}, out_features={self.out_features}, bfloat16, {fused} GELU"


def _packed_or_none(plain: BFloat16Linear) -> Tensor | None:
    """`plain`'s weight packed for oneDNN's fused product, or None where that product is missing or
    wrong (another torch build, no oneDNN)."""
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(plain.weight, _PACKED_ROWS)
        check = torch.randn(2, 8, plain.in_features, generator=torch.Generator().manual_seed(0))
        check = check.to(torch.bfloat16)
        fused = torch.ops.mkldnn._linear_pointwise(check, packed, plain.bias, "gelu", [], "tanh")
        expected = F.gelu(plain(check).float(), approximate="tanh")
        if (
            fused.shape != expected.shape
            or float((fused.float() - expected).abs().max()) > _SELF_CHECK_TOLERANCE
        ):
            raise RuntimeError("the packed product disagrees with the plain one")
    except (AttributeError, RuntimeError) as exc:
        log.info("bfloat16 DiT: the feed-forward's GELU runs unfused (%s)", exc)
        return None
    return packed


def bfloat16_dit(dit: DiT) -> int:
    """Run `dit`'s transformer blocks in bfloat16 as the module docstring says, in place; return how
    many linears were replaced."""
    count = 0
    for block in dit.transformer_blocks:
        attn, ff = block.attn, block.ff.ff
        for name in ("to_q", "to_k", "to_v"):  # straight into the bfloat16 attention
            setattr(attn, name, BFloat16Linear(getattr(attn, name), out_dtype=torch.bfloat16))
        attn.to_out[0] = BFloat16Linear(attn.to_out[0])
        ff[0] = BFloat16LinearGelu(ff[0][0])  # the hidden layer with its GELU
        ff[2] = BFloat16Linear(ff[2])
        count += 6
    dit.set_attention_dtype(torch.bfloat16)
    return count
