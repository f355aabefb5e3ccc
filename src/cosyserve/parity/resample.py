"""Parity of the prompt resampler with `resample.npz`: the official `torchaudio.transforms.Resample` results
for 2 s of speech at common upload rates, to 16 kHz (tokenizer, speaker embedding) and 24 kHz (prompt mel).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from cosyserve.errors import ModelDirError
from cosyserve.frontend.resampling import prompt_resample
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity import CheckResult, compare

GOLDEN_FILE = "resample.npz"
# Measured max |diff| over all eight pairs: 1.2e-7 on AVX-512 and on AVX2 (ATEN_CPU_CAPABILITY=avx2 ...);
# the fixture's stated tolerance is 1e-5.
RESAMPLE_TOLERANCE = 1e-5
_OUTPUT_KEY = re.compile(r"out_(\d+)_(\d+)")


def run(model_dir: ModelDir, fixture_dir: Path) -> list[CheckResult]:
    """One check per `out_{orig}_{new}` array: `prompt_resample(in_{orig})` against it."""
    golden_path = Path(fixture_dir) / GOLDEN_FILE
    try:
        with np.load(golden_path) as data:
            golden = {key: data[key] for key in data.files}
    except (OSError, ValueError) as exc:
        raise ModelDirError(f"{golden_path} cannot be read ({exc}); regenerate the parity fixtures") from exc
    pairs = sorted(
        (int(m[1]), int(m[2]), key) for key in golden if (m := _OUTPUT_KEY.fullmatch(key)) is not None
    )
    if not pairs:
        raise ModelDirError(
            f"{golden_path} holds no out_<rate>_<rate> arrays; regenerate the parity fixtures"
        )
    results = []
    for orig, new, key in pairs:
        name = f"resample {orig}->{new}"
        source = golden.get(f"in_{orig}")
        if source is None:
            results.append(CheckResult(name, float("inf"), RESAMPLE_TOLERANCE, f"in_{orig} missing"))
            continue
        results.append(compare(name, prompt_resample(source, orig, new), golden[key], RESAMPLE_TOLERANCE))
    return results
