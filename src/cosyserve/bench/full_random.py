"""The real CosyVoice3 architecture with random weights, built in memory in a second or two.

Used by `cosyserve bench --model full-random` to measure speed and memory without a download, and
(at `scale="tiny"`) by the tests. The sizes come from `model.sizes` (those of
`Fun-CosyVoice3-0.5B-2512`, written out so the bench needs no files).

Building is fast because no default initialisation runs: the modules are constructed with the
in-place random fills of `torch.nn.init` turned into no-ops (buffers such as rotary tables are still
computed normally), and every parameter is then filled from one small seeded pool of normal values,
scaled by `1/sqrt(fan_in)` so activations stay in a realistic range through all layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from cosyserve.model.config import CosyVoice3Config
from cosyserve.model.flow import CausalFlow
from cosyserve.model.hift import HiFTVocoder
from cosyserve.model.no_init import NoRandomInit
from cosyserve.model.sizes import full_size_config, tiny_config
from cosyserve.model.speech_lm import SpeechLM

__all__ = [
    "SCALES",
    "RandomModels",
    "build_random_models",
    "config_for_scale",
    "full_size_config",
    "module_bytes",
    "tiny_config",
]

SCALES = ("full", "tiny")
_POOL_SIZE = (1 << 22) + 15  # values in the fill pool; odd so long tensors do not repeat row-aligned
_BIAS_STD = 0.02


def config_for_scale(scale: str) -> CosyVoice3Config:
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}: use one of {', '.join(SCALES)}")
    return full_size_config() if scale == "full" else tiny_config()


@dataclass
class RandomModels:
    """The three networks, float32, eval mode, no gradients."""

    config: CosyVoice3Config
    llm: SpeechLM
    flow: CausalFlow
    hift: HiFTVocoder

    def weight_bytes(self) -> int:
        """Bytes of every parameter and buffer (what a checkpoint-loaded engine would hold)."""
        return sum(module_bytes(m) for m in (self.llm, self.flow, self.hift))


def module_bytes(module: nn.Module) -> int:
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def _fill_parameters(module: nn.Module, generator: torch.Generator) -> None:
    """Fill every parameter from a shared pool of N(0, 1) values, at a random offset, scaled.

    Weights (>= 2 dims): std 1/sqrt(fan_in). Biases: std 0.02. Other vectors (norm weights, Snake
    alphas): 1 + 0.02 N(0, 1), i.e. near their usual value of one.
    """
    pool = torch.randn(_POOL_SIZE, generator=generator)
    with torch.no_grad():
        for name, param in module.named_parameters():
            flat = param.view(-1)
            if param.dim() >= 2:
                scale, shift = 1.0 / math.sqrt(param[0].numel()), 0.0
            elif name.endswith("bias"):
                scale, shift = _BIAS_STD, 0.0
            else:
                scale, shift = _BIAS_STD, 1.0
            offset = int(torch.randint(_POOL_SIZE, (1,), generator=generator))
            done = 0
            while done < flat.numel():
                take = min(flat.numel() - done, _POOL_SIZE - offset)
                torch.mul(pool[offset : offset + take], scale, out=flat[done : done + take])
                done, offset = done + take, 0
            if shift:
                flat.add_(shift)


def _build(factory, generator: torch.Generator) -> nn.Module:  # type: ignore[no-untyped-def]
    with NoRandomInit():
        module = factory()
    _fill_parameters(module, generator)
    return module.eval().requires_grad_(False)


def build_random_models(scale: str = "full", seed: int = 0) -> RandomModels:
    """The three networks of `config_for_scale(scale)` with seeded random weights, on the CPU.

    The speech LM holds no text LM head (as when loaded from `llm.pt`).
    """
    config = config_for_scale(scale)
    generator = torch.Generator().manual_seed(seed)
    llm = _build(lambda: SpeechLM(config.llm), generator)
    flow = _build(lambda: CausalFlow(config.flow), generator)
    hift = _build(lambda: HiFTVocoder(config.hift), generator)
    return RandomModels(config, llm, flow, hift)  # type: ignore[arg-type]
