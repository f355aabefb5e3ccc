"""The flow's speed options and their deviation report.

The exact path integrates the flow with 10 Euler steps and classifier-free guidance (a conditioned
and an unconditioned DiT row per step), as the official inference does. Two separately named options
trade accuracy for speed: `flow_steps` (fewer steps, about proportionally less flow time) and
`no_cfg` (guidance off: half the DiT rows). Neither is the official output, so whoever uses them gets
the deviation measured on the very weights they run: the max and mean absolute mel difference from
the exact solver on a fixed probe input with the same start noise (`measure_flow_options`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from cosyserve.errors import InputError
from cosyserve.model.flow import DEFAULT_N_TIMESTEPS, CausalFlow

MAX_FLOW_STEPS = 100
# The probe: the sizes of the fast preset's flow probe (quantize.py), its own seed.
PROBE_PROMPT_TOKENS = 10
PROBE_TOKENS = 15
_PROBE_SEED = 4321


def check_flow_options(flow_steps: int, no_cfg: bool) -> None:
    """Raise InputError for a step count outside 1 .. MAX_FLOW_STEPS."""
    del no_cfg  # any value is valid; kept so callers check both options in one place
    if not isinstance(flow_steps, int) or not 1 <= flow_steps <= MAX_FLOW_STEPS:
        raise InputError(f"--flow-steps {flow_steps!r}: use a whole number from 1 to {MAX_FLOW_STEPS}")


def is_exact(flow_steps: int, no_cfg: bool) -> bool:
    return flow_steps == DEFAULT_N_TIMESTEPS and not no_cfg


def flow_options_label(flow_steps: int, no_cfg: bool) -> str:
    """One line for reports, e.g. `4 Euler steps, no CFG (NOT the exact path)`."""
    guidance = "no CFG" if no_cfg else "with CFG"
    exactness = "exact" if is_exact(flow_steps, no_cfg) else "NOT the exact path"
    return f"{flow_steps} Euler steps, {guidance} ({exactness})"


@dataclass(frozen=True)
class FlowOptionsDeviation:
    """How far the flow with the options is from the exact solver on the probe input."""

    flow_steps: int
    no_cfg: bool
    max_abs_mel: float
    mean_abs_mel: float
    against: str  # what the reference was
    probe: str  # what the probe input was

    def to_dict(self) -> dict[str, float | int | bool | str]:
        return asdict(self)


@torch.inference_mode()
def probe_mel(flow: CausalFlow, flow_steps: int = DEFAULT_N_TIMESTEPS, no_cfg: bool = False) -> torch.Tensor:
    """The one-shot mel (80, frames) of the fixed probe input with these options, float32 on the CPU."""
    generator = torch.Generator().manual_seed(_PROBE_SEED)
    vocab = flow.config.vocab_size
    prompt_tokens = torch.randint(0, vocab, (1, PROBE_PROMPT_TOKENS), generator=generator)
    tokens = torch.randint(0, vocab, (1, PROBE_TOKENS), generator=generator)
    prompt_mel = torch.randn(
        1, PROBE_PROMPT_TOKENS * flow.token_mel_ratio, flow.config.output_size, generator=generator
    )
    embedding = torch.randn(1, flow.config.spk_embed_dim, generator=generator)
    mel = flow.inference(
        tokens, prompt_tokens, prompt_mel, embedding, n_timesteps=flow_steps, guidance=not no_cfg
    )
    return mel[0].float().cpu()


def probe_description() -> str:
    return (
        f"seed {_PROBE_SEED}: flow {PROBE_PROMPT_TOKENS} prompt + {PROBE_TOKENS} new tokens, one-shot, "
        "same start noise"
    )


def measure_flow_options(
    reference: torch.Tensor, flow: CausalFlow, flow_steps: int, no_cfg: bool, against: str
) -> FlowOptionsDeviation:
    """Compare `probe_mel(flow, flow_steps, no_cfg)` with `reference` (an exact `probe_mel`)."""
    diff = (probe_mel(flow, flow_steps, no_cfg) - reference).abs()
    return FlowOptionsDeviation(
        flow_steps=flow_steps,
        no_cfg=no_cfg,
        max_abs_mel=float(diff.max()),
        mean_abs_mel=float(diff.mean()),
        against=against,
        probe=probe_description(),
    )
