"""Float32 one-row products for exact LM decoding on AVX2 CPUs: the `gemv_avx2` kernel.

Why: a decoding step reads every weight once, so exact decoding runs at the speed its products stream
1.4 GB of float32 weights. On an AVX2-only AMD EPYC (2 threads, a float32 sum reading 30.6 GB/s in the
same run, 256 MB of weights per shape so that each product reads memory) MKL's `mv` read the
checkpoint's `(out, in)` layout at 11-19 GB/s and oneDNN's blocked copy at 17-27 GB/s; this kernel
reads the `(out, in)` layout as it is at 23-32 GB/s (`native/f32_products.c`: each thread streams a
contiguous stretch of rows, eight side by side).

Exact: the same values as `F.linear` up to float rounding (a relative 2.5e-7 from a float64 product on
the shapes above), and each row's sums in one order whatever the number of rows in a call, so batched
decoding gives each request the values it gets alone. Inputs of more than `MAX_ROWS` rows (the LM's
prefill) go to `F.linear` on the same weight, whose matrix product is what such inputs need: no copy
is made for either.

The kernel lies in the library `native_int8` builds and loads (one build, one `COSYSERVE_NATIVE_KERNELS`
switch). It is offered where /proc/cpuinfo lists avx2 and fma, the library loads, and its product
agrees with float64 on a check at load; the calibration (`engine.calibration`) measures it beside
MKL's and oneDNN's kernels per shape and keeps it where it streams fastest.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from cosyserve.engine.native_int8 import availability, avx2_kernel_runs, native_library

__all__ = ["KERNEL", "MAX_ROWS", "F32Linear", "f32_linear", "native_f32_available"]

KERNEL = "gemv_avx2"
MAX_ROWS = 16  # the C file's MAX_ROWS: longer inputs are matrix products, for F.linear
_CHECK_TOLERANCE = 1e-5  # relative to the output's largest value; float rounding is ~1e-7


@availability
def native_f32_available() -> bool:
    """Whether `gemv_avx2` runs here (see the module docstring)."""
    return avx2_kernel_runs(f"float32 kernel {KERNEL}", _self_check, "MKL's and oneDNN's serve")


def f32_linear(
    x: Tensor, weight: Tensor, bias: Tensor | None, norm: tuple[Tensor, float] | None = None
) -> Tensor:
    """`x @ weight.T + bias`: `(..., in)` float32 -> `(..., out)` float32, `weight` `(out, in)`, once
    (a layer that calls it every step holds an `F32Linear`).

    norm: `(weight (in,), eps)` of an RMSNorm before the product, computed by it: `rms_norm(x) @
    weight.T + bias` (the LM's two per layer, which cost ~25 us a call as torch calls of their own).
    Up to `MAX_ROWS` rows through the kernel; longer inputs, other dtypes and a non-contiguous weight
    through torch (the same values to float rounding)."""
    return F32Linear(weight, bias, norm)(x)


class F32Linear:
    """`f32_linear` with its weight, bias and norm fixed: whether the kernel can read them is decided
    once, here, and a call checks only its input (a decoding step makes ~100 calls)."""

    def __init__(self, weight: Tensor, bias: Tensor | None, norm: tuple[Tensor, float] | None = None) -> None:
        self.weight, self.bias, self.norm = weight, bias, norm
        given = [t for t in (weight, bias, None if norm is None else norm[0]) if t is not None]
        self.kernel_reads_weights = all(t.dtype == torch.float32 and t.is_contiguous() for t in given)

    def __call__(self, x: Tensor) -> Tensor:
        weight, bias, norm = self.weight, self.bias, self.norm
        in_features = weight.shape[-1]
        rows = x.numel() // in_features if in_features else 0
        if not (0 < rows <= MAX_ROWS and x.dtype == torch.float32 and self.kernel_reads_weights):
            if norm is not None:
                x = F.rms_norm(x, (in_features,), norm[0], norm[1])
            return F.linear(x, weight, bias)
        library = native_library()
        if library is None:
            raise RuntimeError(f"the {KERNEL} kernel is not available on this machine")
        flat = x.reshape(rows, in_features).contiguous()
        out = torch.empty(rows, weight.shape[0])
        scratch = None if norm is None else torch.empty(rows, in_features)
        status = library.cosyserve_f32_linear_avx2(
            flat.data_ptr(),
            rows,
            in_features,
            weight.data_ptr(),
            0 if bias is None else bias.data_ptr(),
            out.data_ptr(),
            weight.shape[0],
            torch.get_num_threads(),
            0 if norm is None else norm[0].data_ptr(),
            0.0 if norm is None else norm[1],
            0 if scratch is None else scratch.data_ptr(),
        )
        if status != 0:
            raise RuntimeError(f"the {KERNEL} kernel refused a {rows}x{in_features} input")
        return out.view(*x.shape[:-1], weight.shape[0])


def _self_check() -> None:
    """Odd shapes (a tail of inputs, a last group of fewer rows), with and without a norm, against
    float64."""
    generator = torch.Generator().manual_seed(0)
    for rows, out_features, in_features in ((1, 37, 70), (5, 19, 803)):
        weight = torch.randn(out_features, in_features, generator=generator)
        bias = torch.randn(out_features, generator=generator)
        x = torch.randn(rows, in_features, generator=generator)
        norm = (torch.rand(in_features, generator=generator) + 0.5, 1e-6)
        normed = F.rms_norm(x.double(), (in_features,), norm[0].double(), norm[1])
        for given, rows_in in ((None, x.double()), (norm, normed)):
            expected = rows_in @ weight.double().t() + bias.double()
            got = f32_linear(x, weight, bias, given).double()
            error = float((got - expected).abs().max() / expected.abs().max())
            if not error < _CHECK_TOLERANCE:
                raise RuntimeError(f"the compiled kernel disagrees with float64 (relative {error:.2e})")
