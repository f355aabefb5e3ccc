"""Compute presets: `exact` (float32, the parity path) and `fast` (reduced-precision products on the CPU).

`fast` changes three networks:
- the LM's decoding products (q/k/v, o, gate/up, down per layer, and the output layer): float16 or
  int8 weights per shape, whichever this CPU runs faster (the closer one, float16, when they are
  within a margin), chosen by a short measured calibration (`lm_layout`, `calibration`); the output
  layer, whose log-probs drive sampling, is float16 or float32, never int8. The decoder layers' many-row
  inputs (the prefill) use a bfloat16 copy of the weights where that is measured faster
  (`MatmulSpeed.prefill_in_bfloat16`);
- the DiT blocks' `nn.Linear`s: bfloat16 (`matrix_units.BFloat16Linear`) where this CPU has bfloat16
  matrix units and a measured product runs clearly faster in bfloat16 than in float32 and about as
  fast as in int8 (`matrix_units.matmul_speed`, cached per machine), else int8 (`int8.Int8Linear`:
  weights per output channel, activations per call, fbgemm; 7-bit activations without VNNI,
  `check_reduce_range`);
- the vocoder's upsampling and residual-block convolutions: bfloat16 (`matrix_units.BFloat16Conv`)
  where a measured convolution runs clearly faster so; its first and last convolutions, the source
  branch's strided convolutions, the F0 predictor and the inverse STFT stay float32.
The DiT's attention runs in bfloat16 with a bfloat16 DiT, and with an int8 one where the compiled
bfloat16 attention is measured clearly faster than float32's (`native_dit_attention`, AVX-512 BF16).
Everything else stays float32: embeddings, norms, the flow's input and output projections.
`COSYSERVE_BFLOAT16` (`matrix_units.bfloat16_override`) forces the bfloat16 parts, for comparisons.

`apply_preset` measures the deviation on a fixed probe input before returning, so every run of the
fast preset can report how far it is from the exact path on the very weights it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from cosyserve.engine.bfloat16_dit import bfloat16_dit
from cosyserve.engine.int8 import Int8Linear, check_reduce_range, cpu_has_vnni, int8_available
from cosyserve.engine.kv_cache import KVCache
from cosyserve.engine.linear_kernels import FAST_KERNELS
from cosyserve.engine.lm_layout import PRODUCTS, default_calibration, pack_speech_lm
from cosyserve.engine.matrix_units import (
    BFloat16Conv,
    MatmulSpeed,
    bfloat16_override,
    matmul_speed,
)
from cosyserve.engine.native_dit_attention import use_bfloat16_attention
from cosyserve.engine.speech_lm_runner import decode_one, prefill
from cosyserve.errors import InputError
from cosyserve.model.flow import CausalFlow
from cosyserve.model.hift import HiFTVocoder
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
    return replace_modules(root, lambda name, module: isinstance(module, nn.Linear) and select(name), make)


def replace_modules(
    root: nn.Module, select: Callable[[str, nn.Module], bool], make: Callable[[nn.Module], nn.Module]
) -> int:
    """Replace every module under `root` for which `select(qualified name, module)` holds by
    `make(module)`; return how many."""
    targets = [(name, module) for name, module in root.named_modules() if name and select(name, module)]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = root.get_submodule(parent_name) if parent_name else root
        setattr(parent, child, make(module))
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
    bfloat16: dict[str, bool] | None = None  # fast: which of `matrix_units.PARTS` run in bfloat16


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
    models: HasLLMAndFlow,
    preset: str,
    *,
    measure: bool = True,
    matmul: MatmulSpeed | None = None,
    hift: HiFTVocoder | None = None,
) -> PresetResult:
    """Convert `models.llm`, `models.flow` and `hift` (when given) in place for `preset`; for `fast`,
    measure the LM's and the flow's deviation (the vocoder's is `bench.waveform`'s).

    The networks must be float32 on the CPU for `fast`. `measure=False` skips the probe (a few
    seconds on the full-size model) and leaves `deviation` None. `matmul`: this machine's product
    speeds (default: `matrix_units.matmul_speed`, cached per machine), which pick what runs in bfloat16.
    """
    device = models.llm.speech_embedding.weight.device
    check_preset(preset, device)
    if preset == "exact":
        return PresetResult("exact", "exact (float32, parity path)", {}, None)
    reduce_range = check_reduce_range(None)
    reference = _probe(models) if measure else None
    matmul = matmul or matmul_speed(default_calibration())
    forced = bfloat16_override()
    prefill_rule = matmul.prefill_in_bfloat16 if forced is None else (lambda _kernel: "prefill" in forced)
    layout = pack_speech_lm(models.llm, "fast", reduce_range=reduce_range, prefill_bfloat16=prefill_rule)
    dit_bf16 = matmul.use_bfloat16 if forced is None else "dit" in forced
    attention_bf16 = not dit_bf16 and (
        matmul.use_bfloat16_attention if forced is None else "attention" in forced
    )
    vocoder_bf16 = hift is not None and (matmul.use_bfloat16_conv if forced is None else "vocoder" in forced)
    layers = len(models.llm.qwen2.layers)
    counts = {
        # q, k, v, o, gate, up and down per layer, and the output layer when it is reduced too
        "llm": 7 * layers + (layout.kernels["llm_decoder"] in FAST_KERNELS),
        "flow": bfloat16_dit(models.flow.decoder.estimator)
        if dit_bf16
        else quantize_linears(models.flow, _dit_selected, reduce_range),
    }
    if attention_bf16:  # where the compiled kernel does not run here, the attention stays float32
        attention_bf16 = use_bfloat16_attention(models.flow.decoder.estimator) > 0
    if vocoder_bf16 and hift is not None:
        counts["vocoder"] = bfloat16_vocoder(hift)
    deviation = None
    if reference is not None:
        deviation = _deviation(reference, _probe(models))
    bfloat16 = {
        "dit": dit_bf16,
        "prefill": bool(layout.prefill_bfloat16),
        "vocoder": vocoder_bf16,
        "attention": dit_bf16 or attention_bf16,
    }
    label = _fast_label(layout.kernels, layout.prefill_bfloat16, bfloat16, reduce_range, matmul)
    return PresetResult("fast", label, counts, deviation, layout.kernels, matmul.to_dict(), bfloat16)


def bfloat16_vocoder(hift: HiFTVocoder) -> int:
    """Run `hift`'s upsampling and residual-block convolutions in bfloat16 (`BFloat16Conv`), in place;
    return how many. Its first and last convolutions, the source branch's strided ones, the F0
    predictor and the inverse STFT stay float32 (they set the pitch and the output's magnitude)."""
    count = 0
    for index, up in enumerate(hift.ups):
        hift.ups[index] = BFloat16Conv(up)
        count += 1
    for block in [*hift.resblocks, *hift.source_resblocks]:
        for convs in (block.convs1, block.convs2):
            for index, conv in enumerate(convs):
                convs[index] = BFloat16Conv(conv)
                count += 1
    return count


def _fast_label(
    kernels: dict[str, str],
    prefill: tuple[str, ...],
    bfloat16: dict[str, bool],
    reduce_range: bool,
    matmul: MatmulSpeed,
) -> str:
    """One line: each part's kernel or dtype, and the measured speeds that chose them."""
    activations = "7-bit" if reduce_range else "8-bit"
    lm = ", ".join(f"{name} {kernels[name]}" for name in PRODUCTS)
    lm += f"; prefill of {'/'.join(prefill)} bfloat16" if prefill else "; prefill as decoding"
    dit = (
        "bfloat16 linears and attention"
        if bfloat16["dit"]
        else f"int8 linears, {activations} dynamic activations"
        + (", bfloat16 attention" if bfloat16["attention"] else "")
    )
    vocoder = "bfloat16 convolutions" if bfloat16["vocoder"] else "float32"
    forced = " (forced by COSYSERVE_BFLOAT16)" if bfloat16_override() is not None else ""
    return f"fast{forced} (LM {lm}; DiT {dit}; vocoder {vocoder} [{matmul.describe()}]; NOT bit-exact)"


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
