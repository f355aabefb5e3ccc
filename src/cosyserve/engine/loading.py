"""Building the three networks of a model directory with their weights, strictly checked."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from cosyserve.model.checkpoint import load_into, read_state_dict
from cosyserve.model.flow import CausalFlow
from cosyserve.model.hift import HiFTVocoder
from cosyserve.model.speech_lm import SpeechLM
from cosyserve.modeldir.model_dir import ModelDir

CPU = torch.device("cpu")


def load_speech_lm(
    model_dir: ModelDir, device: torch.device = CPU, dtype: torch.dtype = torch.float32
) -> SpeechLM:
    """`llm.pt` → SpeechLM (memory-mapped weights, the unused 151k-row text LM head never kept)."""
    return SpeechLM.from_checkpoint(
        model_dir.file("llm.pt"), model_dir.config.llm, device=device, dtype=dtype
    )


def load_flow(
    model_dir: ModelDir, device: torch.device = CPU, dtype: torch.dtype = torch.float32
) -> CausalFlow:
    """`flow.pt` → CausalFlow (speech tokens → mel)."""
    with torch.device("meta"):
        flow = CausalFlow(model_dir.config.flow)
    load_into(flow, read_state_dict(model_dir.file("flow.pt")), "flow.pt")
    return flow.to(device=device, dtype=dtype).eval().requires_grad_(False)


def load_hift(
    model_dir: ModelDir, device: torch.device = CPU, dtype: torch.dtype = torch.float32
) -> HiFTVocoder:
    """`hift.pt` → HiFTVocoder. Kept in float32 whatever the engine dtype: reduced precision hurts F0."""
    del dtype
    vocoder = HiFTVocoder.from_state_dict(model_dir.config.hift, read_state_dict(model_dir.file("hift.pt")))
    return vocoder.to(device=device).requires_grad_(False)


CHECKPOINT_LOADERS: dict[str, Callable[[ModelDir], nn.Module]] = {
    "llm.pt": load_speech_lm,
    "flow.pt": load_flow,
    "hift.pt": load_hift,
}
