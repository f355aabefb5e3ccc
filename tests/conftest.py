"""Shared test fixtures: where `../shared` (parity fixtures, real speech prompts) lives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def find_shared_dir() -> Path | None:
    candidate = Path(os.environ.get("COSYSERVE_SHARED", REPO_ROOT.parent / "shared"))
    return candidate if candidate.is_dir() else None


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """`../shared`; in CI its absence is a failure, elsewhere the test is skipped."""
    found = find_shared_dir()
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("../shared not found: set COSYSERVE_SHARED to the shared fixtures directory")
        pytest.skip("../shared not found (set COSYSERVE_SHARED)")
    return found


@pytest.fixture(scope="session")
def tiny_dir(shared_dir: Path) -> Path:
    """The parity fixture directory: `tiny/model` plus the official outputs for it."""
    return shared_dir / "parity" / "tiny"
