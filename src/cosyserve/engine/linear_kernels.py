"""Linear layers held in the weight layout of one CPU kernel, chosen per matrix shape at load time.

A one-row product (LM decoding) reads every weight once, so its speed is the speed at which its kernel
streams that layout from memory, and that differs by CPU and library: on an AVX2-only AMD EPYC, MKL
reads `(out, in)` float32 weights at 9-13 GB/s and a contiguous `(in, out)` copy at 17-18 GB/s
(issue 20), while an AVX-512 Xeon reads both at its bandwidth. So the layout is measured, not assumed
(`engine.calibration`), among these kernels:

exact (float32, the same values up to float rounding):
- `linear`: `(out, in)` as stored, `F.linear` (MKL's gemm); no copy
- `linear_gemv`: the same layout, one-row products through `torch.mv` (MKL's gemv), the others as `linear`
- `transposed`: a contiguous `(in, out)` copy, `addmm` (MKL's gemm)
- `transposed_gemv`: the same copy, one-row products through gemv
- `onednn`: oneDNN's blocked layout for one-row products (`mkldnn._reorder_linear_weight`)
- `gemv_avx2`: the stored layout, up to 16 rows through our AVX2 kernel (`native_f32`), more through
  `F.linear`; no copy
(MKL takes other code paths on other CPU vendors: which of gemm and gemv streams a layout fastest is
measured, not assumed.)
fast (reduced-precision weights, float32 activations and accumulation):
- `fp16`: float16 weights, fbgemm's packed product (`fp16_linear`, with a tested plain-torch fallback)
- `int8`: int8 weights per output channel, int8 activations per call (`quantize.Int8Linear`)
and, for either, optionally a bfloat16 copy of the weights for inputs of `PREFILL_MIN_ROWS` rows or more
(the LM's prefill) where the CPU multiplies bfloat16 faster (`matrix_units.MatmulSpeed`): one more
copy, half the float32 size, so it is made only where chosen.

A copy replaces its source: when the source lies in a memory-mapped checkpoint its pages are handed
back to the kernel (`release_file_pages`), so the weights are never resident twice.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

EXACT_KERNELS = ("linear", "linear_gemv", "transposed", "transposed_gemv", "onednn", "gemv_avx2")
NO_COPY_KERNELS = ("linear", "linear_gemv", "gemv_avx2")  # use an `(out, in)` float32 source as it is
FAST_KERNELS = ("fp16", "int8", "int8_vnni", "int8_avx2")
INT8_KERNELS = ("int8", "int8_vnni", "int8_avx2")  # int8 weights, 8-bit (or 7-bit) activations
NATIVE_INT8_KERNELS = ("int8_vnni", "int8_avx2")  # ours (`native_int8`)
NORM_KERNELS = (*NATIVE_INT8_KERNELS, "gemv_avx2")  # ours: they can compute an RMSNorm before the product
KERNELS = EXACT_KERNELS + FAST_KERNELS
# From this many rows a bfloat16 product beats fbgemm's float16 one on an AVX-512 BF16 EPYC (9728x896:
# 3.3 vs 2.9 ms at 16 rows, 1.8 vs 2.3 ms at 8; one thread); one-row decoding never reaches it.
PREFILL_MIN_ROWS = 16


def available_kernels(candidates: tuple[str, ...] = KERNELS) -> tuple[str, ...]:
    """Those of `candidates` this torch build can run on the CPU."""
    return tuple(name for name in candidates if _AVAILABLE[name]())


def onednn_available() -> bool:
    """Whether this torch can pack weights for oneDNN's products (`mkldnn._reorder_linear_weight`)."""
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    except (AttributeError, RuntimeError):
        return False


def fbgemm_fp16_available() -> bool:
    """Whether fbgemm's float16-weight product is in this build (else `fp16_linear` falls back)."""
    try:
        return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(
            torch.ops.quantized, "linear_dynamic_fp16"
        )
    except (AttributeError, RuntimeError):
        return False


def _int8_available() -> bool:
    from cosyserve.engine.int8 import int8_available

    return int8_available()


def _native_int8_available(kernel: str) -> bool:
    from cosyserve.engine.native_int8 import native_int8_available

    return native_int8_available(kernel)


def _native_f32_available() -> bool:
    from cosyserve.engine.native_f32 import native_f32_available

    return native_f32_available()


_AVAILABLE: dict[str, Callable[[], bool]] = {
    "linear": lambda: True,
    "linear_gemv": lambda: True,
    "transposed": lambda: True,
    "transposed_gemv": lambda: True,
    "onednn": onednn_available,
    "gemv_avx2": _native_f32_available,
    "fp16": lambda: True,  # the fallback always runs
    "int8": _int8_available,
    "int8_vnni": functools.partial(_native_int8_available, "int8_vnni"),
    "int8_avx2": functools.partial(_native_int8_available, "int8_avx2"),
}


# ---- float16 weights ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fp16Weight:
    """A float16 weight ready for `fp16_linear`: fbgemm's packed form, or a plain `(out, in)` float16
    tensor plus bias for the fallback."""

    packed: object | None  # torch's LinearPackedParams (fbgemm), bias inside
    weight: Tensor | None  # (out, in) float16, fallback only
    bias: Tensor | None  # (out,) float32, fallback only


def pack_fp16(weight: Tensor, bias: Tensor | None, *, use_fbgemm: bool | None = None) -> Fp16Weight:
    """`weight` `(out, in)` float32 → float16 (values beyond the float16 range saturate, as fbgemm does)."""
    if use_fbgemm is None:
        use_fbgemm = fbgemm_fp16_available()
    if use_fbgemm:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao deprecation notices; the op itself is current
            packed = torch.ops.quantized.linear_prepack_fp16(weight.float().contiguous(), bias)
        return Fp16Weight(packed, None, None)
    limit = torch.finfo(torch.float16).max
    half = weight.float().clamp(-limit, limit).half()
    return Fp16Weight(None, half, None if bias is None else bias.float().clone())


def fp16_linear(x: Tensor, weight: Fp16Weight) -> Tensor:
    """`(..., in)` float32 → `(..., out)` float32 with float16 weights, accumulated in float32.

    The one place that calls fbgemm's float16 product; without it the weights are widened per call
    (the same values to float rounding, slower).
    """
    if weight.packed is not None:
        return torch.ops.quantized.linear_dynamic_fp16(x.float().contiguous(), weight.packed)
    if weight.weight is None:
        raise ValueError("an Fp16Weight holds either a packed weight or a float16 tensor")
    return F.linear(x.float(), weight.weight.float(), weight.bias)


# ---- the module -----------------------------------------------------------------------------------
class PackedLinear(nn.Module):
    """`nn.Linear` with its weight in the layout of `kernel` (see the module docstring).

    `(..., in_features)` float32 → `(..., out_features)` float32. Build with `pack_linear`.
    """

    def __init__(
        self,
        kernel: str,
        in_features: int,
        out_features: int,
        forward: Callable[[Tensor], Tensor],
        nbytes: int,
        dense: Callable[[], tuple[Tensor, Tensor | None]] | None = None,
        norm: tuple[Tensor, float] | None = None,
    ) -> None:
        super().__init__()
        self.kernel, self.in_features, self.out_features = kernel, in_features, out_features
        self._forward = forward
        self._dense = dense
        self.norm = norm  # (weight, eps) of the RMSNorm this computes before its product, or None
        self.weight_nbytes = nbytes  # bytes one product reads (for the roofline report)

    def forward(self, x: Tensor) -> Tensor:
        return self._forward(x)

    def few_rows_product(self) -> Callable[[Tensor], Tensor]:
        """What computes inputs of fewer than `PREFILL_MIN_ROWS` rows (decoding): the kernel's own
        product, also where a bfloat16 copy serves the longer ones."""
        forward = self._forward
        if isinstance(forward, functools.partial) and forward.func is _rows_in_bfloat16:
            return forward.keywords["few_rows"]
        return forward

    def dense_weight(self) -> tuple[Tensor, Tensor | None]:
        """The float32 `(out, in)` weight and `(out,)` bias or None this computes with: exact kernels
        only (a view where the layout allows, else a copy)."""
        if self._dense is None:
            raise ValueError(f"a {self.kernel} linear keeps no float32 weight to repack")
        return self._dense()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel}"


def pack_linear(
    weight: Tensor | Sequence[Tensor],
    bias: Tensor | Sequence[Tensor] | None,
    kernel: str,
    *,
    reduce_range: bool | None = None,
    prefill_bfloat16: bool = False,
    norm: tuple[Tensor, float] | None = None,
) -> PackedLinear:
    """A `PackedLinear` computing `x @ weight.T + bias` with `kernel`.

    `weight` `(out, in)` float32, or several `(out_i, in)` parts computed side by side (fused q/k/v,
    gate/up), with as many biases or None. One `linear` weight is used as is (no copy); everything else
    is copied once into the kernel's layout, and the pages of a memory-mapped source are then released
    (`release_file_pages`). reduce_range: `int8` only (None: this CPU's choice). prefill_bfloat16:
    `fp16`/`int8` only, inputs of `PREFILL_MIN_ROWS` rows or more use a bfloat16 copy of the weights.
    norm: `(weight (in,), eps)` of an RMSNorm before the product, computed by it (`NORM_KERNELS` only:
    the int8 ones normalise each row they quantise, `gemv_avx2` each row it multiplies; longer inputs
    and the bfloat16 copy's rows are normalised by torch).
    """
    parts = [weight.detach()] if isinstance(weight, Tensor) else [w.detach() for w in weight]
    biases = None if bias is None else [bias] if isinstance(bias, Tensor) else list(bias)
    joined_bias = None if biases is None else torch.cat([b.detach().float() for b in biases])
    in_features = parts[0].shape[1]
    out_features = sum(part.shape[0] for part in parts)
    elements = out_features * in_features
    if kernel not in KERNELS:
        raise ValueError(f"unknown linear kernel {kernel!r}: one of {', '.join(KERNELS)}")
    width = 2 if kernel == "fp16" else 1 if kernel in INT8_KERNELS else 4
    if prefill_bfloat16 and kernel not in FAST_KERNELS:
        raise ValueError(f"a bfloat16 prefill copy is for the fp16/int8 kernels, not {kernel!r}")
    if norm is not None and kernel not in NORM_KERNELS:
        raise ValueError(
            f"an RMSNorm is computed inside {', '.join(NORM_KERNELS)} products only, not {kernel!r}"
        )
    if norm is not None:
        norm = (norm[0].detach().float().contiguous(), float(norm[1]))
    if kernel in NO_COPY_KERNELS and len(parts) == 1 and _usable_as_is(parts[0], kernel):  # no copy
        forward, dense = _pack_plain(parts[0], joined_bias, kernel, reduce_range, norm)
        return PackedLinear(kernel, in_features, out_features, forward, elements * width, dense, norm)
    if kernel in ("transposed", "transposed_gemv"):  # one copy, straight into the (in, out) layout
        transposed = torch.cat([part.t() for part in parts], dim=1).float().contiguous()
        gemv = kernel == "transposed_gemv"
        forward = functools.partial(_transposed, weight_t=transposed, bias=joined_bias, gemv=gemv)
        dense = functools.partial(_pair, transposed.t(), joined_bias)
    else:
        joined = parts[0].float().contiguous() if len(parts) == 1 else torch.cat(parts).float()
        forward, dense = _pack_plain(joined, joined_bias, kernel, reduce_range, norm)
        if prefill_bfloat16:
            folded = joined if norm is None else joined * norm[0].detach().float()[None, :]
            forward = functools.partial(
                _rows_in_bfloat16,
                few_rows=forward,
                weight=folded.to(torch.bfloat16),
                bias=joined_bias,
                norm_eps=None if norm is None else norm[1],
            )
    for part in parts:
        release_file_pages(part)
    return PackedLinear(kernel, in_features, out_features, forward, elements * width, dense, norm)


def _pack_plain(
    weight: Tensor,
    bias: Tensor | None,
    kernel: str,
    reduce_range: bool | None,
    norm: tuple[Tensor, float] | None = None,
) -> tuple[Callable[[Tensor], Tensor], Callable[[], tuple[Tensor, Tensor | None]] | None]:
    """The forward of `kernel` over a contiguous `(out, in)` float32 weight, and how to get the float32
    weight back (None for the reduced-precision kernels)."""
    if kernel in ("linear", "linear_gemv"):
        forward = functools.partial(_linear, weight=weight, bias=bias, gemv=kernel == "linear_gemv")
        return forward, functools.partial(_pair, weight, bias)
    if kernel == "gemv_avx2":
        from cosyserve.engine.native_f32 import F32Linear, native_f32_available

        if not native_f32_available():
            raise RuntimeError("the gemv_avx2 kernel is not available on this machine")
        return F32Linear(weight, bias, norm), functools.partial(_pair, weight, bias)
    if kernel == "onednn":
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        forward = functools.partial(_onednn, packed=packed, bias=bias)
        return forward, lambda: (packed.to_dense(), bias)
    if kernel == "fp16":
        return functools.partial(fp16_linear, weight=pack_fp16(weight, bias)), None
    if kernel in NATIVE_INT8_KERNELS:
        from cosyserve.engine.native_int8 import NativeInt8Linear

        return NativeInt8Linear(weight, bias, norm=norm, kernel=kernel), None
    from cosyserve.engine.int8 import Int8Linear

    return Int8Linear.from_weight(weight, bias, reduce_range), None


def _usable_as_is(weight: Tensor, kernel: str) -> bool:
    """Whether `kernel` computes with `weight` itself: MKL takes any float32 strides, our kernel a
    contiguous float32 matrix only (else it gets a contiguous copy)."""
    return kernel != "gemv_avx2" or (weight.dtype == torch.float32 and weight.is_contiguous())


def _rows_in_bfloat16(
    x: Tensor,
    few_rows: Callable[[Tensor], Tensor],
    weight: Tensor,
    bias: Tensor | None,
    norm_eps: float | None = None,
) -> Tensor:
    """`few_rows(x)` below `PREFILL_MIN_ROWS` rows, else the product with the bfloat16 `weight` `(out, in)`,
    float32 out with the bias added in float32; `norm_eps`: RMS-normalise the rows first (the norm's
    weight is folded into `weight`)."""
    if x.numel() < PREFILL_MIN_ROWS * x.shape[-1]:
        return few_rows(x)
    if norm_eps is not None:
        x = F.rms_norm(x.float(), x.shape[-1:], None, norm_eps)
    out = F.linear(x.to(torch.bfloat16), weight).float()
    return out if bias is None else out + bias


def _pair(weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor | None]:
    return weight, bias


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None, gemv: bool = False) -> Tensor:
    if gemv and x.numel() == x.shape[-1]:
        out = torch.mv(weight, x.reshape(-1)) if bias is None else torch.addmv(bias, weight, x.reshape(-1))
        return out.view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)


def _transposed(x: Tensor, weight_t: Tensor, bias: Tensor | None, gemv: bool = False) -> Tensor:
    if gemv and x.numel() == x.shape[-1]:
        vector = x.reshape(-1)
        out = torch.mv(weight_t.t(), vector) if bias is None else torch.addmv(bias, weight_t.t(), vector)
        return out.view(*x.shape[:-1], weight_t.shape[1])
    rows = x.reshape(-1, x.shape[-1])
    out = torch.mm(rows, weight_t) if bias is None else torch.addmm(bias, rows, weight_t)
    return out.view(*x.shape[:-1], weight_t.shape[1])


def _onednn(x: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


# ---- memory-mapped sources ------------------------------------------------------------------------
_MADV_DONTNEED = 4


def release_file_pages(tensor: Tensor) -> int:
    """Drop this process's resident pages of `tensor` when it lies in a file mapping (a memory-mapped
    checkpoint); return the bytes released (0 elsewhere, and off Linux).

    Only whole pages inside the tensor are released (neighbouring tensors share the edge pages). The
    mapping's pages were only read, so a later read, if any, faults them in again from the file: this
    never changes a value. Anonymous memory is never touched (there it would zero the data).
    """
    if sys.platform != "linux" or tensor.device.type != "cpu" or tensor.is_mkldnn:
        return 0
    if not tensor.is_contiguous():
        return 0
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    page = mmap.PAGESIZE
    first, last = -(-start // page) * page, end // page * page
    if last <= first or not _in_file_mapping(first, last):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), _MADV_DONTNEED) != 0:
        return 0
    return last - first


def _in_file_mapping(start: int, end: int) -> bool:
    """Whether [start, end) lies inside one private mapping of a regular file (/proc/self/maps)."""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                low, _, high = fields[0].partition("-")
                if not int(low, 16) <= start < int(high, 16):
                    continue
                path = fields[5].strip() if len(fields) > 5 else ""
                private = fields[1].endswith("p")
                return (
                    end <= int(high, 16) and private and path.startswith("/") and not path.startswith("/dev/")
                )
    except (OSError, ValueError, IndexError):
        return False
    return False
