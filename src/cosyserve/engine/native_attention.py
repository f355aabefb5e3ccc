"""One new LM position's attention in one compiled call per layer, for CPU decoding.

Why: between a decoding step's matrix products each layer makes ~20 small torch calls for its
attention (rotary embedding of q and k, two cache writes, scaling, two batched products, softmax,
reshapes). On an AVX2-only AMD EPYC (2 threads, the full-size LM at ~400 positions) a step without its
products took 14 ms, of which these calls were the largest part: MKL's batched product alone took
~50 us a call at these shapes. `native/attention.c` does the same arithmetic in float32 in one call
(see its header): 27 us against ~170 us a layer at 300 positions, ~25 us more for this module's
Python. The LM's `Attention` modules call it through their `one_position` hook, which
`place_speech_lm` sets on the CPU in float32.

The same values as the torch path to float rounding (keys, values and output within 1e-5 of the
largest value over 60 steps, `tests/test_native_attention.py`), the exact preset's parity included.
The kernel lies in the library `native_int8` builds (one build, one `COSYSERVE_NATIVE_KERNELS`
switch) and is used where /proc/cpuinfo lists avx2 and fma, the library loads, and a check at load
agrees with the torch path; anything it cannot take (another dtype or device, an unusual stride) goes
the torch way.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cosyserve.engine.native_int8 import availability, avx2_kernel_runs, native_library
from cosyserve.model.config import Qwen2Config
from cosyserve.model.qwen2 import Attention, RotaryTable

__all__ = ["NewPositionAttention", "native_attention_available", "use_native_attention"]

_CHECK_TOLERANCE = 1e-5  # relative to the largest value; float rounding is ~1e-7


@availability
def native_attention_available() -> bool:
    """Whether the compiled attention runs here (see the module docstring)."""
    return avx2_kernel_runs("compiled attention", _self_check, "torch's serves")


def use_native_attention(model: nn.Module) -> int:
    """Set the compiled attention as the one-position path of every `Attention` in `model` where it
    runs; return how many were set (0 where it does not run here)."""
    if not native_attention_available():
        return 0
    layers = [module for module in model.modules() if isinstance(module, Attention)]
    for layer in layers:
        layer.one_position = NewPositionAttention(layer.num_heads, layer.num_kv_heads, layer.head_dim)
    return len(layers)


class NewPositionAttention:
    """`Attention.one_position`: writes the new key (rotated) and value at `start` and returns the
    attention output `(B, 1, heads * head_dim)`, or None for inputs it does not take (the caller
    then runs the torch path).

    q `(B, 1, heads * head_dim)`, k and v `(B, 1, kv_heads * head_dim)` (views into one projection
    are fine), cos and signed_sin `(1, head_dim)` at `start`, kv the layer's cache
    `(2, B, kv_heads, capacity, head_dim)`.
    """

    def __init__(self, heads: int, kv_heads: int, head_dim: int) -> None:
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, cos: Tensor, signed_sin: Tensor, kv: Tensor, start: int
    ) -> Tensor | None:
        if not self._takes(q, k, v, cos, signed_sin, kv, start):
            return None
        library = native_library()
        if library is None:
            return None
        batch = q.shape[0]
        out = torch.empty(batch, 1, self.heads * self.head_dim)
        scores = torch.empty(batch * self.heads * (start + 1))
        keys, (values_offset, batch_stride, head_stride) = kv.data_ptr(), kv.stride()[:3]
        status = library.cosyserve_attend_new_position(
            q.data_ptr(),
            q.stride(0),
            k.data_ptr(),
            k.stride(0),
            v.data_ptr(),
            v.stride(0),
            batch,
            self.heads,
            self.kv_heads,
            self.head_dim,
            cos.data_ptr(),
            signed_sin.data_ptr(),
            keys,
            keys + 4 * values_offset,  # kv[1]: float32
            batch_stride,
            head_stride,
            start,
            out.data_ptr(),
            scores.data_ptr(),
            torch.get_num_threads(),
        )
        return out if status == 0 else None

    def _takes(
        self, q: Tensor, k: Tensor, v: Tensor, cos: Tensor, signed_sin: Tensor, kv: Tensor, start: int
    ) -> bool:
        """float32 CPU tensors in the layouts the kernel reads (few, straight-line checks: this runs 24
        times a step, and each microsecond here is 2-4 % of the kernel's time)."""
        d = self.head_dim
        if kv.dtype != torch.float32 or kv.device.type != "cpu" or d % 8 or kv.stride()[3:] != (d, 1):
            return False
        two, batch, kv_heads, capacity, width = kv.shape
        if (two, kv_heads, width) != (2, self.kv_heads, d) or not 0 <= start < capacity:
            return False
        inputs = (q, k, v, cos, signed_sin)
        if any(t.dtype != torch.float32 or t.stride(-1) != 1 for t in inputs):
            return False
        kv_width = kv_heads * d
        return (
            q.shape == (batch, 1, self.heads * d)
            and k.shape == v.shape == (batch, 1, kv_width)
            and cos.shape == signed_sin.shape == (1, d)
        )


def _self_check() -> None:
    """Two rows, grouped heads, a few cached positions: one `Attention` step with and without it."""
    generator = torch.Generator().manual_seed(0)
    config = Qwen2Config(48, 96, 1, 6, 2, 10, 1e-6, 10000.0, 64)
    layer = Attention(config)
    for parameter in layer.parameters():
        parameter.data = torch.randn(parameter.shape, generator=generator) * 0.3
    batch, start = 2, 9
    x = torch.randn(batch, 1, config.hidden_size, generator=generator)
    cos, signed_sin = RotaryTable(config.head_dim, config.rope_theta, 64)(start, 1)
    cache = torch.randn(2, batch, config.num_key_value_heads, start + 3, config.head_dim, generator=generator)
    expected_cache = cache.clone()
    hook = NewPositionAttention(layer.num_heads, layer.num_kv_heads, layer.head_dim)
    with torch.inference_mode():
        expected = layer(x, cos, signed_sin, expected_cache, start, None)
        if hook(*layer._project(x), cos, signed_sin, cache.clone(), start) is None:
            raise RuntimeError("the compiled attention refused its own check's inputs")
        layer.one_position = hook
        got = layer(x, cos, signed_sin, cache, start, None)
    error = float((got - expected).abs().max() / expected.abs().max())
    cache_error = float((cache - expected_cache).abs().max() / expected_cache.abs().max())
    if not (error < _CHECK_TOLERANCE and cache_error < _CHECK_TOLERANCE):
        worst = max(error, cache_error)
        raise RuntimeError(f"the compiled attention disagrees with torch's (relative {worst:.2e})")
