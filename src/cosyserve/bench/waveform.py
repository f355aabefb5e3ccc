"""How far a preset's audio is from the exact path's: the flow's probe mel (`flow_options.probe_mel`)
through the exact vocoder before the preset, and through the preset's vocoder (bfloat16 convolutions
where the fast preset chose them) after it, with the same fixed source noise."""

from __future__ import annotations

import math
from typing import Any

import torch

from cosyserve.engine.flow_options import probe_description
from cosyserve.model.hift import HiFTVocoder


@torch.inference_mode()
def probe_waveform(hift: HiFTVocoder, mel: torch.Tensor) -> torch.Tensor:
    """The vocoder's waveform (S,) float32 on the CPU for a probe mel (80, frames)."""
    weight = next(hift.parameters())
    wav, _ = hift.inference(mel[None].to(weight.device), finalize=True)
    return wav[0].float().cpu()


def waveform_deviation(reference: torch.Tensor, mel: torch.Tensor, hift: HiFTVocoder) -> dict[str, Any]:
    """max/mean |d wav| and the signal-to-difference ratio (dB) of `mel`'s audio through `hift` against
    `reference` (S,), the exact path's waveform (`probe_waveform` of the exact mel and vocoder)."""
    other = probe_waveform(hift, mel)
    diff = (reference - other).abs()
    noise = float(diff.square().sum())
    signal = float(reference.square().sum())
    return {
        "max_abs_wav": float(diff.max()),
        "mean_abs_wav": float(diff.mean()),
        "wav_snr_db": math.inf if noise == 0 else 10 * math.log10(max(signal, 1e-30) / noise),
        "probe": probe_description() + ", through the vocoder",
    }
