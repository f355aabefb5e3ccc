"""The DiT in bfloat16 where the CPU multiplies it natively (the fast preset, `matrix_units`).

What runs in bfloat16: every linear of the transformer blocks, the attention (scores, weighted sum and
the keys and values a stream keeps), and the feed-forward's hidden layer (its GELU included). What
stays float32: the residual stream, the norms and their time modulation, the biases of the layers that
write into the residual stream, the input embedding, the output projection and the solver's state.

Why the attention too: on an Intel Xeon with AMX, the DiT's products in bfloat16 take 3 s of a 13.6 s
flow, and float32 attention 5.7 s of the rest (SDPA's flash kernel, 2 x 16 heads x 800 frames: 24 ms a
call in float32, 10 ms in bfloat16; it accumulates in float32 either way). Keeping the hidden layer in
bfloat16 spares a float32 copy of the widest activation; the second linear rounds its input to
bfloat16 anyway.

The products run on weights packed once for oneDNN (`torch.ops.mkldnn._linear_pointwise`, as torch's
compiler calls it): 17 % faster than `F.linear` on 1600 rows and 30 % on the 200 rows of a stream's
chunk pass there, and the hidden layer's tanh-GELU is applied to the float32 accumulator in the same
call (torch's own GELU over the bfloat16 output took as long as the product: 3.2 of 6.1 ms). Each
packed product is checked against the plain one when built; where oneDNN cannot pack bfloat16 (no
AVX-512 BW/VL/DQ or AVX-NE-CONVERT, as on AVX2) or disagrees, the plain product runs.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosyserve.engine.linear_kernels import onednn_available
from cosyserve.model.dit import DiT

__all__ = ["BFloat16Linear", "bfloat16_dit"]

log = logging.getLogger(__name__)

_PACKED_ROWS = 1600  # the rows oneDNN lays the packed weight out for: a one-shot pass's 2 x 800 frames
_SELF_CHECK_TOLERANCE = 0.05  # the packed product against float32 on the check input (|Δ| of values
# ~1: bfloat16's rounding of the output is 4e-3 there; a wrong layout or epilogue is off by ~1)


class BFloat16Linear(nn.Module):
    """An `nn.Linear` whose product runs in bfloat16 (weights stored so, packed where oneDNN can).
    `x` `(..., in)`, float32 or bfloat16 -> `(..., out)` in `out_dtype`: float32 (the bias added in
    float32, in the same pass as the widening) or bfloat16 (for a next step that takes bfloat16, the
    bias added before rounding). `gelu`: apply the tanh-GELU to the output (bfloat16 out only)."""

    def __init__(self, linear: nn.Linear, out_dtype: torch.dtype = torch.float32, gelu: bool = False) -> None:
        super().__init__()
        if out_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"a bfloat16 linear writes float32 or bfloat16, not {out_dtype}")
        if gelu and out_dtype != torch.bfloat16:
            raise ValueError("a bfloat16 linear applies GELU to bfloat16 outputs only")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.out_dtype, self.gelu = out_dtype, gelu
        self.register_buffer("weight", linear.weight.detach().to(torch.bfloat16), persistent=False)
        bias = None if linear.bias is None else linear.bias.detach().to(out_dtype)
        self.register_buffer("bias", bias, persistent=False)
        self.register_buffer("packed", self._packed_or_none(), persistent=False)
        if self.packed is not None:
            self.weight = None  # the packed copy serves alone

    def forward(self, x: Tensor) -> Tensor:
        x = x.to(torch.bfloat16)
        if self.packed is not None:
            out = self._packed_product(x, self.packed)
        else:
            out = F.linear(x, self.weight, self.bias if self.out_dtype == torch.bfloat16 else None)
            out = F.gelu(out, approximate="tanh") if self.gelu else out
        if self.out_dtype == torch.bfloat16:
            return out
        # bfloat16 + float32 promotes: widening and bias in one pass over the output.
        return out.float() if self.bias is None else torch.add(self.bias, out)

    def _packed_product(self, x: Tensor, packed: Tensor) -> Tensor:
        """The product (bias and GELU included for bfloat16 outputs) on the packed weight, bfloat16."""
        bias = self.bias if self.out_dtype == torch.bfloat16 else None
        activation, algorithm = ("gelu", "tanh") if self.gelu else ("none", "")
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, activation, [], algorithm)

    def _packed_or_none(self) -> Tensor | None:
        """The weight packed for oneDNN, or None where that product is missing or wrong (another
        torch build, no oneDNN, a CPU it packs no bfloat16 for)."""
        if not onednn_available():
            return None
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, _PACKED_ROWS)
            check = torch.randn(2, 8, self.in_features, generator=torch.Generator().manual_seed(0))
            check = check.to(torch.bfloat16)
            got = self._packed_product(check, packed).float()
            bias = self.bias if self.out_dtype == torch.bfloat16 else None
            expected = F.linear(check.float(), self.weight.float(), None if bias is None else bias.float())
            expected = F.gelu(expected, approximate="tanh") if self.gelu else expected
            if got.shape != expected.shape or float((got - expected).abs().max()) > _SELF_CHECK_TOLERANCE:
                raise RuntimeError("the packed product disagrees with the plain one")
        except (AttributeError, RuntimeError) as exc:
            shape = f"{self.out_features}x{self.in_features}"
            log.info("bfloat16 DiT: a %s product runs unpacked (%s)", shape, exc)
            return None
        return packed

    def extra_repr(self) -> str:
        packed = "packed" if self.packed is not None else "unpacked"
        gelu = ", GELU" if self.gelu else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, bfloat16, {packed}{gelu}"


def bfloat16_dit(dit: DiT) -> int:
    """Run `dit`'s transformer blocks in bfloat16 as the module docstring says, in place; return how
    many linears were replaced."""
    count = 0
    for block in dit.transformer_blocks:
        attn, ff = block.attn, block.ff.ff
        for name in ("to_q", "to_k", "to_v"):  # straight into the bfloat16 attention
            setattr(attn, name, BFloat16Linear(getattr(attn, name), out_dtype=torch.bfloat16))
        attn.to_out[0] = BFloat16Linear(attn.to_out[0])
        ff[0] = BFloat16Linear(ff[0][0], out_dtype=torch.bfloat16, gelu=True)  # the hidden layer
        ff[2] = BFloat16Linear(ff[2])
        count += 6
    dit.set_attention_dtype(torch.bfloat16)
    return count
