"""The exact DiT's products on weights packed once for oneDNN, where this machine runs them faster.

Why: the flow's float32 products are most of its time: 77 % of a guided DiT pass (2 x 800 frames) on an
AMD EPYC Zen 4 with 2 threads (torch.profiler, a quiet machine; the attention 18 %). MKL's sgemm gives
those 1600-row products 155-165 GFLOP/s there, packing the weight again on every call; oneDNN's product
on a weight packed once (`mkldnn._reorder_linear_weight`, as the bfloat16 DiT uses it) 201-212 GFLOP/s,
four alternating rounds over 24 distinct 1024x1024 weights. The values are the same product's up to
float rounding (4.6e-6 of outputs up to 7.0 there; the parity tolerances are 1e-3 and 1e-4).

Where: `loading.place_flow`, for CPU float32 placements of the exact preset, on the attention and
feed-forward linears of every DiT block, when a measurement at load on this machine (a DiT-shaped
product, both ways, alternating, about a quarter of a second) finds the packed one at least
`MIN_GAIN` faster; once per process. `COSYSERVE_DIT_PRODUCT=mkl` or `onednn` decides instead. A packed
layer takes float32 CPU inputs only: anything else is refused with an error, never computed wrongly.
"""

from __future__ import annotations

import functools
import logging
import os
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosyserve.engine.linear_kernels import onednn_available, release_file_pages

__all__ = ["MIN_GAIN", "PackedLinear", "pack_dit_products", "packed_products_chosen"]

log = logging.getLogger(__name__)

MIN_GAIN = 1.05  # packed at least this much faster, or MKL's product stays
ROWS = 1600  # what oneDNN is told to expect: a guided pass over 800 frames (any count works)
_SHAPE = (ROWS, 1024, 1024)  # the measured product: the DiT's attention projections
_CHECK_TOLERANCE = 1e-4  # relative to the largest output: float rounding is ~1e-6, a wrong layout ~1
_PRODUCT_ENV = "COSYSERVE_DIT_PRODUCT"


class PackedLinear(nn.Module):
    """`nn.Linear` on a float32 weight held in oneDNN's blocked layout (the `(out, in)` copy is dropped).

    x: (..., in) float32 on the CPU -> (..., out)."""

    def __init__(self, linear: nn.Linear, packed: Tensor) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", packed, persistent=False)
        self.bias = linear.bias

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise TypeError(f"a packed DiT product takes float32 CPU inputs, got {x.dtype} on {x.device}")
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, float32, oneDNN-packed"


def pack_dit_products(dit: nn.Module) -> int:
    """Replace the attention and feed-forward linears of `dit`'s blocks by `PackedLinear`s where
    `packed_products_chosen()` says so, in place; returns how many were replaced."""
    if not packed_products_chosen():
        return 0
    targets = [
        (name, module)
        for name, module in dit.named_modules()
        if isinstance(module, nn.Linear)
        and name.startswith("transformer_blocks.")
        and (".attn." in name or ".ff." in name)
        and module.weight.dtype == torch.float32
        and module.weight.device.type == "cpu"
    ]
    replaced = 0
    for name, linear in targets:
        packed = _checked_pack(linear)
        if packed is not None:  # (one that fails its check stays MKL's)
            parent_name, _, child = name.rpartition(".")
            setattr(dit.get_submodule(parent_name), child, PackedLinear(linear, packed))
            # The copy replaces its source: a memory-mapped checkpoint's pages go back to the kernel
            # (the mapping outlives one tensor), anonymous memory is freed now, layer by layer.
            release_file_pages(linear.weight)
            linear.weight = None  # type: ignore[assignment]
            replaced += 1
    return replaced


@functools.cache
def packed_products_chosen() -> bool:
    """Whether the exact DiT's products run packed on this machine (see the module docstring)."""
    forced = os.environ.get(_PRODUCT_ENV, "").strip().lower()
    if forced in ("mkl", "onednn"):
        return forced == "onednn" and onednn_available()
    if not onednn_available():
        return False
    try:
        plain_s, packed_s = _timed_both()
    except (AttributeError, RuntimeError) as exc:
        log.info("DiT products: MKL's (oneDNN's packed product unavailable: %s)", exc)
        return False
    chosen = plain_s > packed_s * MIN_GAIN
    log.info(
        "DiT products: %s (a %dx%dx%d product: MKL %.1f ms, oneDNN packed %.1f ms)",
        "oneDNN, packed" if chosen else "MKL's",
        *_SHAPE,
        plain_s * 1e3,
        packed_s * 1e3,
    )
    return chosen


def _timed_both(rounds: int = 3) -> tuple[float, float]:
    """The fastest of `rounds` alternating runs of the DiT-shaped product, plain and packed (seconds)."""
    rows, inner, out = _SHAPE
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, inner, generator=generator)
    weight, bias = torch.randn(out, inner, generator=generator) / inner**0.5, torch.zeros(out)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
    plain_run = lambda: F.linear(x, weight, bias)  # noqa: E731
    packed_run = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")  # noqa: E731
    best = [float("inf"), float("inf")]
    with torch.inference_mode():
        plain_run(), packed_run()  # warm-up (oneDNN builds its kernel on first use)
        for _ in range(rounds):
            for index, run in enumerate((plain_run, packed_run)):
                started = time.perf_counter()
                run()
                best[index] = min(best[index], time.perf_counter() - started)
    return best[0], best[1]


def _checked_pack(linear: nn.Linear) -> Tensor | None:
    """`linear`'s weight packed, if the packed product agrees with `F.linear` on a check."""
    try:
        with torch.no_grad():  # (not inference mode: the packed weight serves outside it too)
            packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), ROWS)
            check = torch.randn(2, 8, linear.in_features, generator=torch.Generator().manual_seed(0))
            got = torch.ops.mkldnn._linear_pointwise(check, packed, linear.bias, "none", [], "")
            expected = F.linear(check, linear.weight, linear.bias)
        scale = max(float(expected.abs().max()), 1e-6)
        if got.shape != expected.shape or float((got - expected).abs().max()) > _CHECK_TOLERANCE * scale:
            raise RuntimeError("the packed product disagrees with F.linear")
    except (AttributeError, RuntimeError) as exc:
        log.warning("DiT products: MKL's (a packed %dx%d product failed its check: %s)",
                    linear.out_features, linear.in_features, exc)  # fmt: skip
        return None
    return packed.detach()
