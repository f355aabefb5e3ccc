"""One LM decoding step through every decoder layer in one compiled call, for CPU decoding.

Why: with the products and the attention compiled, what was left of a decoding step between them was
dispatch: ~15 torch calls a layer (splits, residual adds, SiLU, gate times up, each module's Python)
around four product calls and one attention call. On an AVX2-only AMD EPYC (2 threads, full-size LM,
int8 products) that was ~7.7 ms of a 23.7 ms step. `native/decode_step.c` runs all the layers in
one call with the same kernels, the small steps in C (see its header).

The hook is `Qwen2Model.decode_step`, set by `use_compiled_step` where every decoder layer's four
products run our kernels (`int8_vnni`, `int8_avx2` or `gemv_avx2`: `STEP_KERNELS`) with the two
RMSNorms inside the q/k/v and gate/up products, on the CPU in float32; `lm_layout.pack_speech_lm` sets
or clears it after every packing. It takes one new position per sequence for up to `MAX_ROWS`
sequences, each at its own position (`Qwen2Model.forward` with T = 1, and `forward_rows`, the step of
`decode_batching`), in a float32 CPU cache whose last two dimensions are contiguous; anything else
goes the layer-by-layer way. The same values as that way to float rounding: the products and the
attention are the same functions; SiLU's exponential is a polynomial within 2 ulp of expf (tests:
hidden states within 1e-5 of the largest, over 65 steps and a batch of five positions).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from cosyserve.engine.linear_kernels import PackedLinear, pack_linear
from cosyserve.engine.native_attention import native_attention_available
from cosyserve.engine.native_f32 import F32Linear
from cosyserve.engine.native_int8 import NativeInt8Linear, availability, avx2_kernel_runs, native_library
from cosyserve.model.config import Qwen2Config
from cosyserve.model.qwen2 import Qwen2Model

__all__ = ["STEP_KERNELS", "CompiledDecodeStep", "compiled_step_available", "use_compiled_step"]

log = logging.getLogger(__name__)

STEP_KERNELS = {"int8_vnni": 1, "int8_avx2": 2, "gemv_avx2": 3}  # decode_step.c's kinds
MAX_ROWS = 16  # sequences a step takes (decode_step.c's MAX_ROWS); larger batches decode layer by layer


class _Product(ctypes.Structure):
    """decode_step.c's `Product`."""

    _fields_ = [
        ("kind", ctypes.c_int),
        ("in_features", ctypes.c_int),
        ("padded_in", ctypes.c_int),
        ("out_features", ctypes.c_int),
        ("weight", ctypes.c_void_p),
        ("scale", ctypes.c_void_p),
        ("weight_sum", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("norm_weight", ctypes.c_void_p),
        ("norm_eps", ctypes.c_float),
    ]


class _Layer(ctypes.Structure):
    """decode_step.c's `Layer`."""

    _fields_ = [("qkv", _Product), ("o", _Product), ("gate_up", _Product), ("down", _Product)]


_CHECK_TOLERANCE = 1e-5  # relative to the largest value; float rounding is ~1e-7


@availability
def compiled_step_available() -> bool:
    """Whether the compiled step runs on this machine: the attention's instructions, library and
    check, and a check of its own at load (a small model's steps both ways)."""
    if not native_attention_available():
        return False
    return avx2_kernel_runs("compiled decoding step", _self_check, "the layers decode one by one")


def use_compiled_step(model: Qwen2Model) -> bool:
    """Set `model.decode_step` to a `CompiledDecodeStep` where its layers qualify (see the module
    docstring), else clear it; return whether it is set."""
    model.decode_step = None
    if not compiled_step_available() or next(model.parameters()).device.type != "cpu":
        return False
    try:
        model.decode_step = CompiledDecodeStep(model)
    except ValueError as exc:
        log.debug("LM decoding step layer by layer: %s", exc)
        return False
    return True


class CompiledDecodeStep:
    """`Qwen2Model.decode_step`: runs `embeds` `(B, 1, hidden)`, row b at position `positions[b]`,
    through every decoder layer, writing each layer's key and value of row b into `kv` `(layers, 2, B,
    kv_heads, capacity, head_dim)` at that position (row b attends to its keys up to it), and returns
    the last layer's output `(B, 1, hidden)` before the final norm; None for inputs it does not take
    (more than `MAX_ROWS` rows, other dtypes or devices, a position past the cache: the caller then
    runs the layers itself).

    Raises ValueError when `model`'s layers do not qualify (not every product one of ours, a norm
    outside its product, q/k/v or gate/up not fused)."""

    def __init__(self, model: Qwen2Model) -> None:
        config = model.config
        self.hidden, self.heads = config.hidden_size, config.num_attention_heads
        self.kv_heads, self.head_dim, self.inner = (
            config.num_key_value_heads,
            config.head_dim,
            config.intermediate_size,
        )
        if self.head_dim % 8 or self.head_dim > 256:  # the attention kernel's (attention.c)
            raise ValueError(
                f"head size {self.head_dim}: the compiled attention takes multiples of 8 up to 256"
            )
        self.layers = len(model.layers)
        self._held: list[Tensor] = []  # every tensor a pointer below reads: alive as long as this
        described = [self._describe_layer(index, layer) for index, layer in enumerate(model.layers)]
        self._table = (_Layer * self.layers)(*described)
        self._rotary = model.rotary  # its tables, read at each row's position (rebuilt tables too)
        widest = max(self.hidden, self.inner)
        self._quantized_bytes = -(-widest // 4) * 4
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self._work_per_row = 2 * q_width + 2 * kv_width + self.hidden + 3 * self.inner + widest

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        # A copied model holds copies of the weights this table points at: it decodes layer by layer.
        return None

    def __call__(self, embeds: Tensor, kv: Tensor, positions: Sequence[int]) -> Tensor | None:
        if not self._takes(embeds, kv, positions):
            return None
        library = native_library()
        if library is None:
            return None
        rows = len(positions)
        x = embeds.reshape(rows, self.hidden).clone()
        # Scratch per call, never shared: two requests may decode on one model from two threads.
        work = torch.empty(rows * self._work_per_row + self.heads * (max(positions) + 1))
        quantized = torch.empty(rows * self._quantized_bytes, dtype=torch.uint8)
        strides = kv.stride()
        status = library.cosyserve_decode_layers(
            self._table,
            self.layers,
            x.data_ptr(),
            rows,
            self.hidden,
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.inner,
            kv.data_ptr(),
            strides[0],
            strides[1],
            strides[2],
            strides[3],
            self._rotary.cos.data_ptr(),
            self._rotary.signed_sin.data_ptr(),
            (ctypes.c_int64 * rows)(*positions),
            work.data_ptr(),
            quantized.data_ptr(),
            torch.get_num_threads(),
        )
        if status != 0:  # the cache is intact up to the failing layer; the caller recomputes all of it
            log.warning("compiled decoding step refused layer %d; decoding layer by layer", status - 1)
            return None
        return x.view(rows, 1, self.hidden)

    def _takes(self, embeds: Tensor, kv: Tensor, positions: Sequence[int]) -> bool:
        """float32 CPU tensors in the layouts the kernels read, positions within the cache and the
        rotary tables (few, straight-line checks: this runs every step)."""
        d, rows = self.head_dim, len(positions)
        if not 0 < rows <= MAX_ROWS or embeds.shape != (rows, 1, self.hidden):
            return False
        if embeds.dtype != torch.float32 or embeds.device.type != "cpu":
            return False
        if kv.dtype != torch.float32 or kv.device.type != "cpu" or kv.stride()[4:] != (d, 1):
            return False
        layers, two, batch, kv_heads, capacity, width = kv.shape
        if (layers, two, batch, kv_heads, width) != (self.layers, 2, rows, self.kv_heads, d):
            return False
        tables = (self._rotary.cos, self._rotary.signed_sin)
        if any(t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() for t in tables):
            return False
        limit = min(capacity, self._rotary.cos.shape[0])
        return all(0 <= position < limit for position in positions)

    def _describe_layer(self, index: int, layer: torch.nn.Module) -> _Layer:
        attention, mlp = layer.self_attn, layer.mlp
        products = {
            "qkv": attention.qkv_proj,
            "o": attention.o_proj,
            "gate_up": mlp.gate_up_proj,
            "down": mlp.down_proj,
        }
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        shapes = {
            "qkv": (self.hidden, q_width + 2 * kv_width),
            "o": (q_width, self.hidden),
            "gate_up": (self.hidden, 2 * self.inner),
            "down": (self.inner, self.hidden),
        }
        for name in ("input_layernorm", "post_attention_layernorm"):
            if not isinstance(getattr(layer, name), torch.nn.Identity):
                raise ValueError(f"layer {index}'s {name} is not inside its product")
        described = {}
        for name, module in products.items():
            product = self._describe(module, with_norm=name in ("qkv", "gate_up"))
            if (product.in_features, product.out_features) != shapes[name]:
                raise ValueError(f"layer {index}'s {name} product has another shape than the config's")
            described[name] = product
        return _Layer(**described)

    def _describe(self, module: torch.nn.Module | None, *, with_norm: bool) -> _Product:
        """A `PackedLinear` in one of `STEP_KERNELS`, its norm inside when `with_norm`."""
        if not isinstance(module, PackedLinear) or module.kernel not in STEP_KERNELS:
            kernel = module.kernel if isinstance(module, PackedLinear) else type(module).__name__
            raise ValueError(f"a product runs {kernel}, not one of {', '.join(STEP_KERNELS)}")
        if (module.norm is not None) != with_norm:
            raise ValueError("a norm is not where the compiled step computes it")
        forward = module.few_rows_product()
        kind = STEP_KERNELS[module.kernel]
        if isinstance(forward, NativeInt8Linear):
            tensors = (forward.packed, forward.scale, forward.weight_sum, forward.bias)
            self._held.extend(t for t in tensors if t is not None)
            return _Product(
                kind,
                forward.in_features,
                forward.padded_in,
                forward.out_features,
                forward.packed.data_ptr(),
                forward.scale.data_ptr(),
                forward.weight_sum.data_ptr(),
                _pointer(forward.bias),
                None,
                forward.norm_eps,
            )
        if isinstance(forward, F32Linear) and forward.kernel_reads_weights:
            weight, bias, norm = forward.weight, forward.bias, forward.norm
            self._held.extend(t for t in (weight, bias, None if norm is None else norm[0]) if t is not None)
            out_features, in_features = weight.shape
            eps = -1.0 if norm is None else norm[1]
            norm_weight = None if norm is None else norm[0].data_ptr()
            return _Product(
                kind,
                in_features,
                in_features,
                out_features,
                weight.data_ptr(),
                None,
                None,
                _pointer(bias),
                norm_weight,
                eps,
            )
        raise ValueError(f"a {module.kernel} product holds a {type(forward).__name__}")


def _pointer(tensor: Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _self_check() -> None:
    """Two layers with `gemv_avx2` products (the kernel every AVX2 CPU runs), a few positions: the
    compiled step's hidden states and cache against the layer-by-layer way's."""
    generator = torch.Generator().manual_seed(0)
    config = Qwen2Config(48, 96, 2, 6, 2, 10, 1e-6, 10000.0, 64)
    model = Qwen2Model(config)
    for parameter in model.parameters():
        parameter.data = torch.randn(parameter.shape, generator=generator) * 0.3
    for layer in model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        parts = (attention.q_proj, attention.k_proj, attention.v_proj)
        norm = (layer.input_layernorm.weight.detach(), layer.input_layernorm.eps)
        fused = pack_linear([p.weight for p in parts], [p.bias for p in parts], "gemv_avx2", norm=norm)
        attention.set_fused_qkv(fused)
        attention.o_proj = pack_linear(attention.o_proj.weight, None, "gemv_avx2")
        norm = (layer.post_attention_layernorm.weight.detach(), layer.post_attention_layernorm.eps)
        mlp.fuse_gate_up(
            pack_linear([mlp.gate_proj.weight, mlp.up_proj.weight], None, "gemv_avx2", norm=norm)
        )
        mlp.down_proj = pack_linear(mlp.down_proj.weight, None, "gemv_avx2")
        layer.input_layernorm = layer.post_attention_layernorm = torch.nn.Identity()
    step = CompiledDecodeStep(model)
    shape = (config.num_hidden_layers, 2, 1, config.num_key_value_heads, 12, config.head_dim)
    caches = [torch.randn(shape, generator=generator) for _ in range(2)]
    caches[1].copy_(caches[0])
    with torch.inference_mode():
        for start in (0, 5, 11):
            x = torch.randn(1, 1, config.hidden_size, generator=generator)
            model.decode_step = None
            expected = model(x, caches[0], start)
            model.decode_step = step
            got = model(x, caches[1], start)
            if step(x, caches[1].clone(), [start]) is None:
                raise RuntimeError("the compiled step refused its own check's inputs")
            error = float((got - expected).abs().max() / expected.abs().max())
            cache_error = float((caches[1] - caches[0]).abs().max() / caches[0].abs().max())
            if not (error < _CHECK_TOLERANCE and cache_error < _CHECK_TOLERANCE):
                worst = max(error, cache_error)
                raise RuntimeError(f"the compiled step disagrees with the layers (relative {worst:.2e})")
