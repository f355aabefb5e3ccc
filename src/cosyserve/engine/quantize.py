"""Compute presets: `exact` (float32, the parity path) and `fast` (reduced-precision products on the CPU).

`fast` changes two networks:
- the LM's decoding products (q/k/v, o, gate/up, down per layer, and the output layer): float16 or
  int8 weights per shape, whichever this CPU runs faster (the closer one, float16, when they are
  within a margin), chosen by a short measured calibration (`lm_layout`, `calibration`); the output
  layer, whose log-probs drive sampling, is float16 or float32, never int8;
- the DiT blocks' `nn.Linear`s: bfloat16 (`matrix_units.BFloat16Linear`) where this CPU has bfloat16
  matrix units and a measured product runs clearly faster in bfloat16 (`matrix_units.matmul_speed`,
  cached per machine), else int8 (`int8.Int8Linear`: weights per output channel, activations per
  call, fbgemm; 7-bit activations without VNNI, `check_reduce_range`).
Everything else stays float32: embeddings, norms, attention, the flow's input and output projections,
the F0 predictor and the vocoder.

`apply_preset` measures the deviation on a fixed probe input before returning, so every run of the
fast preset can report how far it is from the exact path on the very weights it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from cosyserve.engine.int8 import Int8Linear, check_reduce_range, cpu_has_vnni, int8_available
from cosyserve.engine.kv_cache import KVCache
from cosyserve.engine.lm_layout import PRODUCTS, default_calibration, pack_speech_lm
from cosyserve.engine.matrix_units import BFloat16Linear, MatmulSpeed, matmul_speed
from cosyserve.engine.speech_lm_runner import decode_one, prefill
from cosyserve.errors import InputError
from cosyserve.model.flow import CausalFlow
from cosyserve.model.speech_lm import SpeechLM

__all__ = [
    "PRESETS",
    "Deviation",
    "Int8Linear",
    "PresetResult",
    "apply_preset",
    "check_preset",
    "check_reduce_range",
    "cpu_has_vnni",
    "int8_available",
    "quantize_linears",
]

PRESETS = ("exact", "fast")
# Probe sizes: long enough to exercise attention over a real prefix, short enough to add seconds only.
PROBE_PREFIX_TOKENS = 32
PROBE_DECODE_STEPS = 12
PROBE_FLOW_PROMPT_TOKENS = 10
PROBE_FLOW_TOKENS = 15
_PROBE_SEED = 1234


def quantize_linears(
    root: nn.Module,
    select: Callable[[str], bool],
    reduce_range: bool | None = None,
    make: Callable[[nn.Linear], nn.Module] | None = None,
) -> int:
    """Replace every `nn.Linear` under `root` whose qualified name passes `select` by `make(linear)`
    (default: an int8 `Int8Linear`); return how many."""
    make = make or (lambda linear: Int8Linear(linear, reduce_range))
    targets = [
        (name, module)
        for name, module in root.named_modules()
        if isinstance(module, nn.Linear) and select(name)
    ]
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = root.get_submodule(parent_name) if parent_name else root
        setattr(parent, child, make(linear))
    return len(targets)


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
    lm_kernels: dict[str, str] | None = None  # fast: the LM's kernel per product (`lm_layout.PRODUCTS`)
    matmul: dict[str, object] | None = None  # fast: the measured float32/bfloat16 speed (`MatmulSpeed`)


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


def apply_preset(
    models: HasLLMAndFlow, preset: str, *, measure: bool = True, matmul: MatmulSpeed | None = None
) -> PresetResult:
    """Convert `models.llm` and `models.flow` in place for `preset`; for `fast`, measure the deviation.

    The networks must be float32 on the CPU for `fast`. `measure=False` skips the probe (a few
    seconds on the full-size model) and leaves `deviation` None. `matmul`: this machine's product
    speeds (default: `matrix_units.matmul_speed`, cached per machine), which pick the DiT's dtype.
    """
    device = models.llm.speech_embedding.weight.device
    check_preset(preset, device)
    if preset == "exact":
        return PresetResult("exact", "exact (float32, parity path)", {}, None)
    reduce_range = check_reduce_range(None)
    reference = _probe(models) if measure else None
    layout = pack_speech_lm(models.llm, "fast", reduce_range=reduce_range)
    layers = len(models.llm.qwen2.layers)
    matmul = matmul or matmul_speed(default_calibration())
    dit_bf16 = matmul.use_bfloat16
    counts = {
        # q, k, v, o, gate, up and down per layer, and the output layer when it is reduced too
        "llm": 7 * layers + (layout.kernels["llm_decoder"] in ("fp16", "int8")),
        "flow": quantize_linears(
            models.flow, _dit_selected, reduce_range, BFloat16Linear if dit_bf16 else None
        ),
    }
    deviation = None
    if reference is not None:
        deviation = _deviation(reference, _probe(models))
    activations = "7-bit" if reduce_range else "8-bit"
    kernels = ", ".join(f"{name} {layout.kernels[name]}" for name in PRODUCTS)
    dit = "bfloat16 linears" if dit_bf16 else f"int8 linears, {activations} dynamic activations"
    label = f"fast (LM {kernels}; DiT {dit} [{matmul.describe()}]; NOT bit-exact)"
    return PresetResult("fast", label, counts, deviation, layout.kernels, matmul.to_dict())


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
