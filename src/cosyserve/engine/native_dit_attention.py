"""The DiT's attention with bfloat16 products on CPUs with AVX-512 BF16, for the fast preset.

Why: on an AMD EPYC with avx512_bf16 and VNNI but no AMX (2 threads), the fast preset's DiT runs its
linears in int8 (faster there than bfloat16), and its attention stayed float32: SDPA's flash kernel,
2 x 16 heads x 800 frames, 33-37 ms a call (the same in bfloat16 there), 43 % of a guided DiT pass.
`native/dit_attention.c` computes it with `vdpbf16ps` (bfloat16 pairs multiplied and summed in
float32, twice float32's FMA rate): 17-20 ms a call. Its rounding is a bfloat16 flash attention's
(q, k, v and the probabilities rounded to bfloat16, sums and softmax in float32): as far from the
float32 attention as torch's bfloat16 SDPA, which the preset's bfloat16 DiT uses on CPUs with AMX.

Where: the fast preset sets it on every DiT block (`use_bfloat16_attention`) when the DiT's linears are
int8 and `matrix_units` measured it clearly faster than the float32 attention on this machine
(`MatmulSpeed.use_bfloat16_attention`, cached per machine). It takes the unmasked attention of head
size 64 in float32 on the CPU (a one-shot flow); anything else (a stream's chunk masks, another dtype
or device) goes through SDPA as before. The kernel lies in the library `native_int8` builds (one build,
one `COSYSERVE_NATIVE_KERNELS` switch) and is offered where /proc/cpuinfo lists avx512f, avx512bw,
avx512vl and avx512_bf16, the library loads, and a check at load agrees with the float32 attention.
"""

from __future__ import annotations

import ctypes
import logging

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosyserve.engine.native_int8 import availability, cpu_supports_kernel, native_library
from cosyserve.model.dit import Attention

__all__ = [
    "BFloat16Attention",
    "bfloat16_attention_available",
    "use_bfloat16_attention",
]

log = logging.getLogger(__name__)

HEAD_DIM = 64  # the C file's HEAD_DIM: the DiT's head size
# Against the float32 attention, relative to the largest output value: bfloat16 rounding of q, k, v
# and the probabilities gives 2e-3-9e-3 on the check's inputs (AMD EPYC Zen 4); a wrong layout or
# softmax is off by ~1.
_CHECK_TOLERANCE = 0.06


@availability
def bfloat16_attention_available() -> bool:
    """Whether the compiled bfloat16 attention runs here (see the module docstring)."""
    if not cpu_supports_kernel(kernel="attention_bf16") or native_library() is None:
        return False
    try:
        _self_check()
    except (RuntimeError, ValueError) as exc:
        log.warning("bfloat16 DiT attention unavailable, the float32 attention serves: %s", exc)
        return False
    return True


def use_bfloat16_attention(dit: nn.Module) -> int:
    """Set `BFloat16Attention` as the attention kernel of every DiT `Attention` of head size 64 under `dit`
    where it runs; return how many (0 where it does not run here)."""
    if not bfloat16_attention_available():
        return 0
    layers = [m for m in dit.modules() if isinstance(m, Attention) and m.dim_head == HEAD_DIM]
    for layer in layers:
        layer.kernel = BFloat16Attention()
    return len(layers)


class BFloat16Attention:
    """A DiT `Attention.kernel`: q `(B, H, Tq, 64)`, k and v `(B, H, Tk, 64)`, float32 on the CPU, any
    strides with a contiguous last dimension (views of a projection's output are fine) ->
    `(B, Tq, H * 64)` float32, or None for inputs it does not take (the caller then runs SDPA)."""

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor | None:
        if not _takes(q, k, v):
            return None
        library = native_library()
        if library is None:
            return None
        batch, heads, frames_q, _ = q.shape
        out = torch.empty(batch, frames_q, heads * HEAD_DIM)
        strides = [(ctypes.c_long * 3)(*t.stride()[:3]) for t in (q, k, v)]
        status = library.cosyserve_dit_attention_bf16(
            q.data_ptr(),
            strides[0],
            k.data_ptr(),
            strides[1],
            v.data_ptr(),
            strides[2],
            batch,
            heads,
            frames_q,
            k.shape[2],
            HEAD_DIM,
            out.data_ptr(),
            torch.get_num_threads(),
        )
        return out if status == 0 else None


def _takes(q: Tensor, k: Tensor, v: Tensor) -> bool:
    tensors = (q, k, v)
    if any(t.dim() != 4 or t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors):
        return False
    if any(t.requires_grad or t.stride(3) != 1 or t.shape[3] != HEAD_DIM for t in tensors):
        return False
    return k.shape == v.shape and q.shape[:2] == k.shape[:2] and min(q.shape[2], k.shape[2]) > 0


def _self_check() -> None:
    """Batches and heads, tails of queries (not a multiple of the task's 8) and keys (not of 32), against
    the float32 attention."""
    generator = torch.Generator().manual_seed(0)
    kernel = BFloat16Attention()
    for batch, heads, frames_q, frames_k in ((1, 1, 3, 5), (2, 3, 37, 70)):
        q, k, v = (
            torch.randn(batch, frames, heads, HEAD_DIM, generator=generator).transpose(1, 2) * 2
            for frames in (frames_q, frames_k, frames_k)
        )
        with torch.inference_mode():
            got = kernel(q, k, v)
            expected = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, frames_q, -1)
        if got is None:
            raise RuntimeError("the compiled attention refused its own check")
        error = float((got - expected).abs().max()) / max(float(expected.abs().max()), 1e-12)
        if not error < _CHECK_TOLERANCE:
            raise RuntimeError(f"the compiled attention disagrees with float32's (relative {error:.2e})")
