"""Parity checks: compare what cosyserve computes with the official code's golden outputs.

Each golden file in a fixture directory has a check module here exposing
`run(model_dir: ModelDir, fixture_dir: Path) -> list[CheckResult]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CheckResult:
    """One compared quantity: its largest absolute difference against the tolerance it must meet."""

    name: str  # e.g. "flow mel_stream1_final0"
    max_abs_diff: float  # 0.0 for exact comparisons (token ids); inf when shapes differ
    tolerance: float
    detail: str = ""  # e.g. a shape mismatch or the first differing tokenizer case

    @property
    def passed(self) -> bool:
        return bool(np.isfinite(self.max_abs_diff)) and self.max_abs_diff <= self.tolerance


def compare(name: str, actual: np.ndarray, expected: np.ndarray, tolerance: float) -> CheckResult:
    """Max absolute difference of two arrays; a shape mismatch fails with the shapes in `detail`."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        return CheckResult(
            name, float("inf"), tolerance, f"shape {actual.shape} != expected {expected.shape}"
        )
    diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    return CheckResult(name, float(diff.max()) if diff.size else 0.0, tolerance)
