"""Parity of the three prompt features with `features.npz`, plus (info only) our resampling of the prompt.

The features are computed from the fixture's own `wav16k` / `wav24k`, so they test the feature math alone.
The resampling results compare soxr with the official torchaudio sinc resampler: different filters, so
they only have to agree loosely; the features' parity does not depend on them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cosyserve.errors import ModelDirError
from cosyserve.frontend.audio import resample
from cosyserve.frontend.features import fbank80, mel24k, whisper_logmel128
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity import CheckResult, compare

GOLDEN_FILE = "features.npz"
FEATURE_TOLERANCE = 1e-3  # mels, as the official code meets against itself across machines
RESAMPLE_TOLERANCE = 1e-2  # info only: a different (but equally valid) resampling filter
REQUIRED_KEYS = ("wav", "sr", "wav16k", "wav24k", "mel24k", "whisper_logmel128", "fbank80")


def run(model_dir: ModelDir, fixture_dir: Path) -> list[CheckResult]:
    """Three feature checks (tolerance 1e-3) and two informational resampling checks."""
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
        ours = resample(golden["wav"], source_rate, rate)
        results.append(_compare_resampled(f"resample {source_rate}->{rate} (info)", ours, expected))
    return results


def _compare_resampled(name: str, ours: np.ndarray, expected: np.ndarray) -> CheckResult:
    """Lengths may differ by a sample between resamplers: compare the common part and say so."""
    common = min(len(ours), len(expected))
    result = compare(name, ours[:common], expected[:common], RESAMPLE_TOLERANCE)
    detail = "info only: soxr vs torchaudio"
    if len(ours) != len(expected):
        detail += f"; lengths {len(ours)} vs {len(expected)}"
    return CheckResult(result.name, result.max_abs_diff, result.tolerance, detail)
