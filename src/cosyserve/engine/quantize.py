"""Compute presets: `exact` (float32, the parity path) and `fast` (int8 matrix products on the CPU).

`fast` swaps the `nn.Linear` layers of the Qwen2 decoder layers and of the DiT blocks for int8
versions: weights quantised once per output channel (symmetric), activations quantised per call
(one scale per tensor) by torch's fbgemm kernels, accumulated in int32 and rescaled to float32.
Each LM layer's q, k and v become one int8 product (same values, one call per decode step).
Matrix-vector products (LLM decoding) read a quarter of the bytes and matrix products run on int8
units, so both get faster, at the cost of a small numeric deviation. Everything else stays float32:
embeddings, norms, the LM's output layer (its log-probs drive sampling), the flow's input and output
projections, the F0 predictor and the vocoder.

`apply_preset` measures that deviation on a fixed probe input before returning, so every run of the
fast preset can report how far it is from the exact path on the very weights it runs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from cosyserve.engine.kv_cache import KVCache
from cosyserve.engine.speech_lm_runner import decode_one, prefill
from cosyserve.errors import InputError
from cosyserve.model.flow import CausalFlow
from cosyserve.model.speech_lm import SpeechLM

PRESETS = ("exact", "fast")
# Probe sizes: long enough to exercise attention over a real prefix, short enough to add seconds only.
PROBE_PREFIX_TOKENS = 32
PROBE_DECODE_STEPS = 12
PROBE_FLOW_PROMPT_TOKENS = 10
PROBE_FLOW_TOKENS = 15
_PROBE_SEED = 1234


class Int8Linear(nn.Module):
    """`nn.Linear` with int8 weights (per output channel) and per-call int8 activations (fbgemm, CPU).

    `(..., in_features)` float32 → `(..., out_features)` float32.
    """

    def __init__(self, linear: nn.Linear, reduce_range: bool | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.reduce_range = check_reduce_range(reduce_range)
        weight = linear.weight.detach().float()
        scales = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12).double()
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        with warnings.catch_warnings():
            # torch marks quantised tensor creation as deprecated; fbgemm's packed kernels still take it.
            warnings.simplefilter("ignore")
            zero_points = torch.zeros(weight.shape[0], dtype=torch.long)
            qweight = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(qweight, bias)

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.quantized.linear_dynamic(x.float().contiguous(), self._packed, self.reduce_range)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def int8_available() -> bool:
    """Whether this torch build has the fbgemm int8 linear kernels the fast preset needs."""
    try:
        return hasattr(torch.ops.quantized, "linear_dynamic") and "fbgemm" in (
            torch.backends.quantized.supported_engines
        )
    except (AttributeError, RuntimeError):
        return False


# fbgemm's own cap on the instructions it uses (FBGEMM_ENABLE_INSTRUCTIONS); these values keep VNNI.
_FBGEMM_VNNI_SETTINGS = ("AVX512_E1", "AVX512_E1_256")
_FBGEMM_CAP_SETTINGS = ("AVX2", "AVX512", "AVX512_256", *_FBGEMM_VNNI_SETTINGS)


def cpu_has_vnni(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether fbgemm's int8 products run on AVX-512 VNNI here: the CPU has it (Linux) and fbgemm's
    instruction cap (`FBGEMM_ENABLE_INSTRUCTIONS`, an unknown value is ignored as fbgemm does) keeps it."""
    cap = os.environ.get("FBGEMM_ENABLE_INSTRUCTIONS")
    if cap in _FBGEMM_CAP_SETTINGS and cap not in _FBGEMM_VNNI_SETTINGS:
        return False
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as info:
            return any(line.startswith("flags") and " avx512_vnni" in line for line in info)
    except OSError:
        return False


def check_reduce_range(reduce_range: bool | None) -> bool:
    """The activation range for int8 products on this CPU: None chooses (7-bit without VNNI, 8-bit with).

    Without VNNI, fbgemm multiplies uint8 activations by int8 weights and adds adjacent pairs in int16
    (`vpmaddubsw`), which saturates for 8-bit activations (relative error ~0.2 measured on AVX2); 7-bit
    activations cannot reach the int16 limit. So 8-bit is refused (InputError) where it would saturate.
    """
    vnni = cpu_has_vnni()
    if reduce_range is None:
        return not vnni
    if not reduce_range and not vnni:
        raise InputError(
            "8-bit int8 activations (reduce_range=False) saturate fbgemm's int8 multiply-add on a CPU "
            "without AVX-512 VNNI: use reduce_range=True (7-bit) or leave it to the default"
        )
    return reduce_range


def quantize_linears(root: nn.Module, select: Callable[[str], bool], reduce_range: bool | None = None) -> int:
    """Replace every `nn.Linear` under `root` whose qualified name passes `select`; return how many."""
    targets = [
        (name, module)
        for name, module in root.named_modules()
        if isinstance(module, nn.Linear) and select(name)
    ]
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = root.get_submodule(parent_name) if parent_name else root
        setattr(parent, child, Int8Linear(linear, reduce_range))
    return len(targets)


def _fuse_llm_qkv(llm: SpeechLM, reduce_range: bool) -> int:
    """Each decoder layer's q, k and v projections as one int8 linear; return how many linears that
    replaced. Outputs equal three separate int8 linears (per-channel weight scales, and one activation
    scale for their shared input), with one activation quantisation and one call per decode step
    instead of three; the DiT's are left apart (fbgemm runs its wide fused product slower)."""
    replaced = 0
    for layer in llm.qwen2.layers:
        layer.self_attn.fuse_qkv(lambda linear: Int8Linear(linear, reduce_range))
        replaced += 3
    return replaced


def _llm_selected(name: str) -> bool:
    return name.startswith("qwen2.layers.")


def _dit_selected(name: str) -> bool:
    return name.startswith("decoder.estimator.transformer_blocks.")


class HasLLMAndFlow(Protocol):
    llm: SpeechLM
    flow: CausalFlow


@dataclass(frozen=True)
class Deviation:
    """How far the preset's outputs are from float32 on the probe input (same weights)."""

    max_abs_logp: float  # log-probs over the speech vocabulary, prefill + teacher-forced decode steps
    max_abs_prob: float  # the same rows as probabilities
    top1_agreement: float  # fraction of rows whose most likely token is unchanged
    max_abs_mel: float  # flow output (log-mel), one-shot, 10 Euler steps with guidance
    mean_abs_mel: float
    probe: str  # what the probe input was

    def to_dict(self) -> dict[str, float | str]:
        return asdict(self)


@dataclass(frozen=True)
class PresetResult:
    preset: str
    label: str  # one line for reports
    quantized_linears: dict[str, int]  # per network
    deviation: Deviation | None  # None for exact


def check_preset(preset: str, device: torch.device) -> None:
    """Raise InputError for an unknown preset or one this device/torch cannot run."""
    if preset not in PRESETS:
        raise InputError(f"unknown preset {preset!r}: use one of {', '.join(PRESETS)}")
    if preset == "fast":
        if device.type != "cpu":
            raise InputError("the fast preset is for CPUs (int8 fbgemm kernels); on a GPU use --preset exact")
        if not int8_available():
            raise InputError(
                "this torch build lacks the fbgemm int8 kernels (torch.ops.quantized.linear_dynamic) the "
                "fast preset needs; use --preset exact"
            )


def apply_preset(models: HasLLMAndFlow, preset: str, *, measure: bool = True) -> PresetResult:
    """Convert `models.llm` and `models.flow` in place for `preset`; for `fast`, measure the deviation.

    The networks must be float32 on the CPU for `fast`. `measure=False` skips the probe (a few
    seconds on the full-size model) and leaves `deviation` None.
    """
    device = models.llm.speech_embedding.weight.device
    check_preset(preset, device)
    if preset == "exact":
        return PresetResult("exact", "exact (float32, parity path)", {}, None)
    reduce_range = check_reduce_range(None)
    reference = _probe(models) if measure else None
    counts = {
        "llm": _fuse_llm_qkv(models.llm, reduce_range)
        + quantize_linears(models.llm, _llm_selected, reduce_range),
        "flow": quantize_linears(models.flow, _dit_selected, reduce_range),
    }
    deviation = None
    if reference is not None:
        deviation = _deviation(reference, _probe(models))
    activations = "7-bit" if reduce_range else "8-bit"
    label = f"fast (int8 LLM and DiT linears, {activations} dynamic activations; NOT bit-exact)"
    return PresetResult("fast", label, counts, deviation)


@dataclass(frozen=True)
class _ProbeOutputs:
    logp: Tensor  # (steps + 1, V)
    mel: Tensor  # (80, frames)
    description: str


@torch.inference_mode()
def _probe(models: HasLLMAndFlow) -> _ProbeOutputs:
    generator = torch.Generator().manual_seed(_PROBE_SEED)
    llm, flow = models.llm, models.flow
    codes = llm.config.speech_token_size
    text_ids = torch.randint(
        0, min(llm.config.qwen2.vocab_size, 151643), (PROBE_PREFIX_TOKENS // 2,), generator=generator
    )
    speech_ids = torch.randint(0, codes, (PROBE_PREFIX_TOKENS // 2,), generator=generator)
    forced = torch.randint(0, codes, (PROBE_DECODE_STEPS,), generator=generator)
    embeds = llm.embed_prefix(torch.empty(0, dtype=torch.long), text_ids, speech_ids)
    weight = llm.speech_embedding.weight
    cache = KVCache.allocate(
        llm.config.qwen2, embeds.shape[1] + PROBE_DECODE_STEPS, device=weight.device, dtype=weight.dtype
    )
    rows = [prefill(llm, embeds, cache)[0]]
    for token in forced[:-1].tolist():
        rows.append(decode_one(llm, torch.tensor([token], device=weight.device), cache)[0])
    prompt_tokens = torch.randint(
        0, flow.config.vocab_size, (1, PROBE_FLOW_PROMPT_TOKENS), generator=generator
    )
    tokens = torch.randint(0, flow.config.vocab_size, (1, PROBE_FLOW_TOKENS), generator=generator)
    prompt_mel = torch.randn(
        1, PROBE_FLOW_PROMPT_TOKENS * flow.token_mel_ratio, flow.config.output_size, generator=generator
    )
    embedding = torch.randn(1, flow.config.spk_embed_dim, generator=generator)
    mel = flow.inference(tokens, prompt_tokens, prompt_mel, embedding, streaming=False, finalize=True)
    description = (
        f"seed {_PROBE_SEED}: LM prefix of {embeds.shape[1]} positions + {PROBE_DECODE_STEPS - 1} forced "
        f"decode steps; flow {PROBE_FLOW_PROMPT_TOKENS} prompt + {PROBE_FLOW_TOKENS} new tokens, one-shot"
    )
    return _ProbeOutputs(torch.stack(rows).float().cpu(), mel[0].float().cpu(), description)


def _deviation(reference: _ProbeOutputs, other: _ProbeOutputs) -> Deviation:
    logp_diff = (reference.logp - other.logp).abs()
    prob_diff = (reference.logp.exp() - other.logp.exp()).abs()
    agree = (reference.logp.argmax(dim=-1) == other.logp.argmax(dim=-1)).float().mean()
    mel_diff = (reference.mel - other.mel).abs()
    return Deviation(
        max_abs_logp=float(logp_diff.max()),
        max_abs_prob=float(prob_diff.max()),
        top1_agreement=float(agree),
        max_abs_mel=float(mel_diff.max()),
        mean_abs_mel=float(mel_diff.mean()),
        probe=reference.description,
    )
