"""`cosyserve parity`: every line is a check with a tolerance, and the exit status says whether all passed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cosyserve.cli import main


def _copy_fixture(tiny_dir: Path, target: Path, only: tuple[str, ...] | None = None) -> Path:
    """A copy of the fixture directory whose files are symlinks (cheap), so one of them can be replaced."""
    target.mkdir()
    for path in tiny_dir.iterdir():
        if only is None or path.name in only or path.name == "model":
            (target / path.name).symlink_to(path.resolve())
    return target


def _perturb(path: Path, key: str, delta: float) -> None:
    """Replace the symlink `path` by a copy of the npz with `delta` added to one sample of `key`."""
    with np.load(path.resolve()) as data:
        arrays = {name: data[name] for name in data.files}
    arrays[key] = arrays[key].copy()
    arrays[key].flat[len(arrays[key]) // 2] += delta
    path.unlink()
    np.savez(path, **arrays)


def test_the_fixture_passes_every_line(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["parity", str(tiny_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "parity: all checks pass"
    checks = lines[:-1]
    assert checks and all(line.startswith("ok  ") and " tol " in line for line in checks)
    assert not any("info" in line for line in checks)
    assert sum(line.split()[1] == "resample" for line in checks) == 8


def test_a_corrupted_resampling_output_fails(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = _copy_fixture(tiny_dir, tmp_path / "tiny")
    _perturb(copy / "resample.npz", "out_44100_16000", 2e-5)  # just over the 1e-5 tolerance
    assert main(["parity", str(copy)]) == 1
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and "resample 44100->16000" in failed[0]
    assert out.splitlines()[-1].startswith("parity: FAILED")


@pytest.mark.parametrize(
    ("golden", "key", "delta", "line"),
    [
        ("features.npz", "wav16k", 1e-4, "features wav16k"),
        ("features.npz", "mel24k", 1e-2, "features mel24k"),
        ("resample.npz", "in_8000", 1e-2, "resample 8000->16000"),
    ],
)
def test_each_broken_golden_value_fails(
    tiny_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    golden: str,
    key: str,
    delta: float,
    line: str,
) -> None:
    copy = _copy_fixture(tiny_dir, tmp_path / "tiny", only=(golden,))
    _perturb(copy / golden, key, delta)
    assert main(["parity", str(copy)]) == 1
    failed = [text for text in capsys.readouterr().out.splitlines() if text.startswith("FAIL")]
    assert any(line in text for text in failed)


def test_an_unreadable_golden_file_fails(tiny_dir: Path, tmp_path: Path) -> None:
    copy = _copy_fixture(tiny_dir, tmp_path / "tiny", only=("resample.npz",))
    (copy / "resample.npz").unlink()
    (copy / "resample.npz").write_bytes(b"not an npz")
    assert main(["parity", str(copy)]) == 1
