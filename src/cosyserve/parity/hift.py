"""Parity of the HiFT vocoder with `hift.npz`: F0 and the waveform with finalize on and off.

The fixture's noise buffers are injected so the waveform is comparable sample by sample.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from cosyserve.model.checkpoint import read_state_dict
from cosyserve.model.hift import HiFTVocoder, SourceNoise
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity import CheckResult, compare

WAVEFORM_TOLERANCE = 1e-4  # what the official code meets against itself across machines
GOLDEN_FILE = "hift.npz"
DEBUG_FILE = "debug.npz"


def run(model_dir: ModelDir, fixture_dir: Path) -> list[CheckResult]:
    """Compare f0, wav_final and wav_nonfinal (and the source signal when `debug.npz` has it)."""
    golden_path = fixture_dir / GOLDEN_FILE
    if not golden_path.is_file():
        return [CheckResult("hift", float("inf"), WAVEFORM_TOLERANCE, f"{golden_path} not found")]
    golden = np.load(golden_path)
    vocoder = HiFTVocoder.from_state_dict(model_dir.config.hift, read_state_dict(model_dir.path / "hift.pt"))
    mel = torch.from_numpy(golden["mel"])[None]  # (1, 80, T)
    noise = SourceNoise(
        rand_ini=torch.from_numpy(golden["rand_ini"]),
        sine_noise=torch.from_numpy(golden["sine_noise"]),
        uv_noise=torch.from_numpy(golden["uv_noise"]),
    )
    f0 = vocoder.predict_f0(mel, finalize=True)
    results = [compare("hift f0", f0.numpy(), golden["f0"], WAVEFORM_TOLERANCE)]

    debug_path = fixture_dir / DEBUG_FILE
    if debug_path.is_file():
        debug = np.load(debug_path)
        if "hift_source_s" in debug.files:
            source = vocoder.make_source(f0, noise)
            results.append(compare("hift source", source.numpy(), debug["hift_source_s"], WAVEFORM_TOLERANCE))

    for key, finalize in (("wav_final", True), ("wav_nonfinal", False)):
        wav, _ = vocoder.inference(mel, finalize=finalize, noise=noise)
        results.append(compare(f"hift {key}", wav[0].numpy(), golden[key], WAVEFORM_TOLERANCE))
    return results
