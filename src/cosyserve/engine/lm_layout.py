"""The speech LM's products in the kernels this machine decodes fastest with (`engine.calibration`).

Decoding one token runs, per decoder layer, q/k/v (fused into one product), o, gate/up (fused), down,
then `llm_decoder`: one-row products whose speed is the speed their weights stream from memory.
`pack_speech_lm` replaces them with `PackedLinear`s in the kernel measured fastest for each shape:

- `exact`: float32 layouts (`(out, in)` or `(in, out)` through MKL's gemm or gemv, oneDNN's blocked
  layout): the same log-probs up to float rounding;
- `fast`: float16 or int8 weights for the decoder layers (whichever is faster; the closer one, float16,
  when within `calibration.FAST_MARGIN`), and float16 or float32 for `llm_decoder`, whose log-probs
  drive sampling (never int8).

A copied layout replaces its source (the pages of a memory-mapped checkpoint are released), so the
weights stay resident once. An LM too small to measure (`MIN_LM_BYTES`: the test and demo models)
keeps its modules in the exact preset; the fast preset gives it int8 products and a float32 output
layer, as before calibration existed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from torch import Tensor, nn

from cosyserve.engine.calibration import Calibration, Choice, Request, default_calibration_dir, shape_key
from cosyserve.engine.linear_kernels import (
    EXACT_KERNELS,
    FAST_KERNELS,
    NORM_KERNELS,
    PackedLinear,
    available_kernels,
    pack_linear,
)
from cosyserve.engine.native_step import STEP_KERNELS, compiled_step_available, use_compiled_step
from cosyserve.errors import InputError
from cosyserve.model.config import LLMConfig
from cosyserve.model.qwen2 import Attention, DecoderLayer, FeedForward, RMSNorm
from cosyserve.model.speech_lm import SpeechLM

PRODUCTS = ("qkv", "o", "gate_up", "down", "llm_decoder")
# An LM whose decoding reads less than this runs from the CPU's caches, where every layout is about as
# fast (the demo and test models): its products keep the defaults and nothing is measured.
MIN_LM_BYTES = 64 << 20
# Forces one kernel for every product of the exact preset ("auto": measured), e.g. to compare layouts.
KERNEL_ENV = "COSYSERVE_LM_KERNEL"
_CANDIDATES = {
    "exact": {name: EXACT_KERNELS for name in PRODUCTS},
    "fast": {**{name: FAST_KERNELS for name in PRODUCTS}, "llm_decoder": ("fp16", *EXACT_KERNELS)},
}
_DEFAULTS = {"exact": {name: "linear" for name in PRODUCTS}, "fast": {**{n: "int8" for n in PRODUCTS}}}
_DEFAULTS["fast"]["llm_decoder"] = "linear"


@dataclass(frozen=True)
class LayoutReport:
    """What `pack_speech_lm` chose per product and what choosing cost."""

    preset: str
    choices: dict[str, Choice] = field(default_factory=dict)  # by product name (PRODUCTS)
    measure_seconds: float = 0.0  # calibration measurements in this call (0 when all were cached)
    pack_seconds: float = 0.0  # building the layouts (copies), measurements excluded
    calibration_file: str | None = None
    prefill_bfloat16: tuple[str, ...] = ()  # products whose many-row inputs use a bfloat16 copy
    compiled_step: bool = False  # decoding steps run all layers in one call (`native_step`)

    @property
    def kernels(self) -> dict[str, str]:
        return {name: choice.kernel for name, choice in self.choices.items()}

    def label(self) -> str:
        """One line: `qkv transposed, o linear, ...` (or "unchanged" when nothing was repacked)."""
        if not self.choices:
            return "unchanged (matrices too small to measure)"
        label = ", ".join(f"{name} {choice.kernel}" for name, choice in self.choices.items())
        return label + (", compiled step" if self.compiled_step else "")

    def to_dict(self) -> dict[str, object]:
        return {
            "preset": self.preset,
            "kernels": self.kernels,
            "choices": {name: choice.to_dict() for name, choice in self.choices.items()},
            "measure_seconds": self.measure_seconds,
            "pack_seconds": self.pack_seconds,
            "calibration_file": self.calibration_file,
            "prefill_bfloat16": list(self.prefill_bfloat16),
            "compiled_step": self.compiled_step,
        }


_DEFAULT_CALIBRATIONS: dict[Path, Calibration] = {}
_DEFAULT_LOCK = threading.Lock()


def default_calibration() -> Calibration:
    """The calibration of this machine under the default cache directory (one per process and key)."""
    directory = default_calibration_dir()
    with _DEFAULT_LOCK:
        calibration = _DEFAULT_CALIBRATIONS.get(directory)
        if calibration is None or calibration.key != Calibration(None).key:
            calibration = _DEFAULT_CALIBRATIONS[directory] = Calibration(directory)
        return calibration


def pack_speech_lm(
    llm: SpeechLM,
    preset: str = "exact",
    calibration: Calibration | None = None,
    *,
    kernels: Mapping[str, str] | None = None,
    reduce_range: bool | None = None,
    prefill_bfloat16: Callable[[str], bool] | None = None,
) -> LayoutReport:
    """Replace the LM's decoding products (in place) by `PackedLinear`s for `preset`; CPU, float32.

    `kernels` forces a kernel per product name (tests, comparisons) instead of measuring; `calibration`
    defaults to this machine's cached one. Layers already packed are repacked from their float32
    weights (exact → fast); a fast layout cannot be repacked (ValueError). `prefill_bfloat16(kernel)`:
    whether a decoder-layer product in that fast kernel also keeps a bfloat16 copy for many-row inputs
    (`linear_kernels.PREFILL_MIN_ROWS`); `llm_decoder` never does (it sees one row per prefill). Where
    q/k/v or gate/up run one of `NORM_KERNELS` (ours), the RMSNorm before them is computed inside the
    product and the layer holds an Identity in its place (`_take_norm`).
    """
    if preset not in _CANDIDATES:
        raise InputError(f"unknown preset {preset!r}: use exact or fast")
    forced = dict(kernels or {})
    if not forced and preset == "exact" and os.environ.get(KERNEL_ENV, "auto") not in ("", "auto"):
        forced = {name: _env_kernel() for name in PRODUCTS}
    calibration = calibration or (default_calibration() if not forced else Calibration(None))
    measured_before = calibration.measured_seconds
    started = time.perf_counter()
    choices = _for_compiled_step(_choose(llm.config, preset, calibration, forced), forced)
    measure = calibration.measured_seconds - measured_before
    if preset == "exact" and all(c.source == "default" and c.kernel == "linear" for c in choices.values()):
        return LayoutReport(preset, {}, measure, 0.0, _path(calibration))
    kernel = {name: choice.kernel for name, choice in choices.items()}
    bf16 = {
        name: name != "llm_decoder"
        and kernel[name] in FAST_KERNELS
        and bool(prefill_bfloat16 and prefill_bfloat16(kernel[name]))
        for name in PRODUCTS
    }
    for layer in llm.qwen2.layers:
        qkv = layer.self_attn.qkv_proj
        norm = _take_norm(layer, "input_layernorm", kernel["qkv"], qkv)
        _pack_attention(layer.self_attn, kernel, bf16, reduce_range, norm)
        norm = _take_norm(layer, "post_attention_layernorm", kernel["gate_up"], layer.mlp.gate_up_proj)
        _pack_feed_forward(layer.mlp, kernel, bf16, reduce_range, norm)
    weight, bias = _weights(llm.llm_decoder)
    llm.llm_decoder = pack_linear(weight, bias, kernel["llm_decoder"], reduce_range=reduce_range)
    compiled = use_compiled_step(llm.qwen2)  # set, or cleared: it points at the products just replaced
    pack = time.perf_counter() - started - measure
    prefill = tuple(name for name in PRODUCTS if bf16[name])
    return LayoutReport(preset, choices, measure, pack, _path(calibration), prefill, compiled)


def _for_compiled_step(choices: dict[str, Choice], forced: Mapping[str, str]) -> dict[str, Choice]:
    """`choices` with every decoder-layer product in one of our kernels where the calibration chose one
    for at least one of them and the compiled step runs here (`native_step`): the step then runs all
    layers in one call, which needs all four products in our kernels. That saves more than any one
    product's kernel can: on an AVX2-only AMD EPYC (2 threads, full-size LM, fast preset) the
    calibration chose fbgemm's int8 for `o` and ours for the rest; a step took 26.1-27.3 ms so against
    14.4-16.1 ms with `o` in ours and the compiled step (five rounds alternating in one process).
    Forced choices stay as given."""
    layer_products = [name for name in PRODUCTS if name != "llm_decoder"]
    ours = [choices[name].kernel for name in layer_products if choices[name].kernel in STEP_KERNELS]
    if not ours or len(ours) == len(layer_products) or not compiled_step_available():
        return choices
    kernel = ours[0]
    return {
        name: Choice(choice.shape, choice.preset, kernel, "compiled step", choice.timings)
        if name in layer_products and name not in forced and choice.kernel not in STEP_KERNELS
        else choice
        for name, choice in choices.items()
    }


def calibrate(config: LLMConfig, preset: str = "exact", calibration: Calibration | None = None) -> float:
    """Measure (or read) the kernels of an LM of `config` before it is loaded; return the seconds
    spent measuring. Calling this before the weights are in memory keeps the measurement's copies
    (a few hundred MB, freed after) below the process's later peak."""
    calibration = calibration or default_calibration()
    before = calibration.measured_seconds
    _choose(config, preset, calibration, {})
    return calibration.measured_seconds - before


def _choose(
    config: LLMConfig, preset: str, calibration: Calibration, forced: Mapping[str, str]
) -> dict[str, Choice]:
    """A kernel per product: forced ones as given, the others from `calibration` (measured together)."""
    requests = {}
    for product in PRODUCTS:
        out_features, in_features, bias = _shape(config, product)
        requests[product] = Request(
            out_features,
            in_features,
            bias,
            preset,
            _CANDIDATES[preset][product],
            forced.get(product, _DEFAULTS[preset][product]),
        )
    measured = [name for name in PRODUCTS if name not in forced]
    if decode_weight_bytes(config) < MIN_LM_BYTES:  # decoding runs from caches: nothing to choose
        choices = {n: _default_choice(requests[n]) for n in measured}
    else:
        choices = dict(zip(measured, calibration.choose_all([requests[n] for n in measured]), strict=True))
    for name, kernel in forced.items():
        request = requests[name]
        shape = shape_key(request.out_features, request.in_features, request.bias)
        choices[name] = Choice(shape, preset, kernel, "forced")
    return {name: choices[name] for name in PRODUCTS}


def decode_weight_bytes(config: LLMConfig) -> int:
    """float32 bytes of every product one decode step reads (all layers and the output layer)."""
    per_layer = sum(o * i for o, i, _ in (_shape(config, p) for p in PRODUCTS if p != "llm_decoder"))
    out_features, in_features, _ = _shape(config, "llm_decoder")
    return 4 * (config.qwen2.num_hidden_layers * per_layer + out_features * in_features)


def _default_choice(request: Request) -> Choice:
    shape = shape_key(request.out_features, request.in_features, request.bias)
    return Choice(shape, request.preset, request.default, "default")


def _shape(llm_config: LLMConfig, product: str) -> tuple[int, int, bool]:
    """(out, in, has bias) of one product kind, from the config (whatever the modules' state)."""
    config = llm_config.qwen2
    hidden, inner = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * config.head_dim
    shapes = {
        "qkv": (config.num_attention_heads * config.head_dim + 2 * kv, hidden, True),
        "o": (hidden, config.num_attention_heads * config.head_dim, False),
        "gate_up": (2 * inner, hidden, False),
        "down": (hidden, inner, False),
        "llm_decoder": (llm_config.decoder_size, llm_config.llm_output_size, False),
    }
    return shapes[product]


def current_kernels(llm: SpeechLM) -> dict[str, str]:
    """The kernel each product of the first decoder layer and `llm_decoder` runs with now (`linear`
    for plain `nn.Linear`s, `int8` for `Int8Linear`s; q/k/v and gate/up report their first part)."""
    layer = llm.qwen2.layers[0]
    attention, mlp = layer.self_attn, layer.mlp
    modules = {
        "qkv": attention.qkv_proj if attention.qkv_proj is not None else attention.q_proj,
        "o": attention.o_proj,
        "gate_up": mlp.gate_up_proj if mlp.gate_up_proj is not None else mlp.gate_proj,
        "down": mlp.down_proj,
        "llm_decoder": llm.llm_decoder,
    }
    return {name: _kernel_name(module) for name, module in modules.items()}


def _kernel_name(module: nn.Module) -> str:
    if isinstance(module, PackedLinear):
        return module.kernel
    return "linear" if isinstance(module, nn.Linear) else type(module).__name__


def _take_norm(
    layer: DecoderLayer, name: str, kernel: str, product: nn.Module
) -> tuple[Tensor, float] | None:
    """The RMSNorm `name` of `layer` as `(weight, eps)` when the product after it computes it (our
    kernels, `NORM_KERNELS`: 1.7 ms of a 22 ms int8 step saved, ~2.5 ms of an exact one), and the layer
    then skips it (an Identity in its place); else None and the layer keeps it. A norm the product
    held before (`product`, being repacked) moves to the new product, or back into the layer."""
    norm = getattr(layer, name)
    held = product.norm if isinstance(product, PackedLinear) else None
    if isinstance(norm, RMSNorm):
        weight, eps = norm.weight.detach(), norm.eps
    elif held is not None:
        weight, eps = held
    else:
        return None
    if kernel not in NORM_KERNELS:
        if not isinstance(norm, RMSNorm):  # the old product computed it: the layer does again
            restored = RMSNorm(weight.shape[0], eps).to(weight.device)
            restored.weight.data = weight.clone()
            setattr(layer, name, restored)
        return None
    setattr(layer, name, nn.Identity())
    return weight, eps


def _pack_attention(
    attention: Attention,
    kernel: Mapping[str, str],
    bf16: Mapping[str, bool],
    reduce_range: bool | None,
    norm: tuple[Tensor, float] | None = None,
) -> None:
    qkv = {
        "kernel": kernel["qkv"],
        "reduce_range": reduce_range,
        "prefill_bfloat16": bf16["qkv"],
        "norm": norm,
    }
    if attention.qkv_proj is None:
        parts = (attention.q_proj, attention.k_proj, attention.v_proj)
        weights = [p.weight for p in parts]
        biases = [p.bias for p in parts]
        attention.set_fused_qkv(pack_linear(weights, biases, **qkv))
    else:
        weight, bias = _weights(attention.qkv_proj)
        attention.qkv_proj = pack_linear(weight, bias, **qkv)
    weight, bias = _weights(attention.o_proj)
    attention.o_proj = pack_linear(
        weight, bias, kernel["o"], reduce_range=reduce_range, prefill_bfloat16=bf16["o"]
    )


def _pack_feed_forward(
    mlp: FeedForward,
    kernel: Mapping[str, str],
    bf16: Mapping[str, bool],
    reduce_range: bool | None,
    norm: tuple[Tensor, float] | None = None,
) -> None:
    gate_up = {
        "kernel": kernel["gate_up"],
        "reduce_range": reduce_range,
        "prefill_bfloat16": bf16["gate_up"],
        "norm": norm,
    }
    if mlp.gate_up_proj is None:
        weights = [mlp.gate_proj.weight, mlp.up_proj.weight]
        mlp.fuse_gate_up(pack_linear(weights, None, **gate_up))
    else:
        weight, bias = _weights(mlp.gate_up_proj)
        mlp.gate_up_proj = pack_linear(weight, bias, **gate_up)
    weight, bias = _weights(mlp.down_proj)
    mlp.down_proj = pack_linear(
        weight, bias, kernel["down"], reduce_range=reduce_range, prefill_bfloat16=bf16["down"]
    )


def _weights(module: nn.Module) -> tuple[Tensor, Tensor | None]:
    """The float32 weight and bias of an `nn.Linear` or an exact `PackedLinear`."""
    if isinstance(module, PackedLinear):
        return module.dense_weight()
    if isinstance(module, nn.Linear):
        return module.weight, module.bias
    raise ValueError(f"cannot repack a {type(module).__name__}: only float32 layouts can be repacked")


def _env_kernel() -> str:
    value = os.environ[KERNEL_ENV]
    if value not in EXACT_KERNELS:
        raise InputError(f"{KERNEL_ENV}={value!r}: use auto or one of {', '.join(EXACT_KERNELS)}")
    if value not in available_kernels(EXACT_KERNELS):
        usable = ", ".join(available_kernels(EXACT_KERNELS))
        raise InputError(f"{KERNEL_ENV}={value!r}: not available on this machine; use auto or {usable}")
    return value


def _path(calibration: Calibration) -> str | None:
    return None if calibration.path is None else str(calibration.path)
