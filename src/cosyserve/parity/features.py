"""Parity of the three prompt features with `features.npz`, and of the prompt's resampling to 16/24 kHz.

The features are computed from the fixture's own `wav16k` / `wav24k`, so they test the feature math alone.
The resampling lines compare `prompt_resample` of the fixture's `wav` (at `sr`) with those two waveforms,
which the official `load_wav` made with torchaudio's resampler.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cosyserve.errors import ModelDirError
from cosyserve.frontend.features import fbank80, mel24k, whisper_logmel128
from cosyserve.frontend.resampling import prompt_resample
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity import CheckResult, compare

GOLDEN_FILE = "features.npz"
FEATURE_TOLERANCE = 1e-3  # mels, as the official code meets against itself across machines
# Measured 1.2e-7 (24 kHz -> 16 kHz) on AVX-512 and AVX2 CPUs: the same filter taps, float32 conv rounding.
RESAMPLE_TOLERANCE = 1e-5
REQUIRED_KEYS = ("wav", "sr", "wav16k", "wav24k", "mel24k", "whisper_logmel128", "fbank80")


def run(model_dir: ModelDir, fixture_dir: Path) -> list[CheckResult]:
    """Three feature checks (1e-3) and the prompt's resampling to 16 and 24 kHz (1e-5)."""
    golden_path = Path(fixture_dir) / GOLDEN_FILE
    try:
        with np.load(golden_path) as data:
            golden = {key: data[key] for key in REQUIRED_KEYS}
    except (OSError, ValueError, KeyError) as exc:
        raise ModelDirError(f"{golden_path} cannot be read ({exc}); regenerate the parity fixtures") from exc
    wav16k, wav24k = golden["wav16k"], golden["wav24k"]
    results = [
        compare("features mel24k", mel24k(wav24k).numpy(), golden["mel24k"], FEATURE_TOLERANCE),
        compare(
            "features whisper_logmel128",
            whisper_logmel128(wav16k).numpy(),
            golden["whisper_logmel128"],
            FEATURE_TOLERANCE,
        ),
        compare("features fbank80", fbank80(wav16k).numpy(), golden["fbank80"], FEATURE_TOLERANCE),
    ]
    source_rate = int(golden["sr"])
    for rate, expected in ((16000, wav16k), (24000, wav24k)):
        ours = prompt_resample(golden["wav"], source_rate, rate)
        results.append(compare(f"features wav{rate // 1000}k", ours, expected, RESAMPLE_TOLERANCE))
    return results
