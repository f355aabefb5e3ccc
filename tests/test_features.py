"""The three prompt features against the official outputs in `features.npz`, and their shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cosyserve.errors import InputError
from cosyserve.frontend.features import (
    fbank80,
    kaldi_mel_banks,
    mel24k,
    slaney_mel_filters,
    whisper_logmel128,
)
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity import features as feature_parity

TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def golden(tiny_dir: Path) -> dict[str, np.ndarray]:
    with np.load(tiny_dir / "features.npz") as data:
        return {key: data[key] for key in data.files}


def max_diff(actual: torch.Tensor, expected: np.ndarray) -> float:
    assert tuple(actual.shape) == expected.shape
    return float(np.abs(actual.numpy().astype(np.float64) - expected).max())


def test_mel24k_matches_official(golden: dict[str, np.ndarray]) -> None:
    assert max_diff(mel24k(golden["wav24k"]), golden["mel24k"]) < TOLERANCE


def test_whisper_logmel128_matches_official(golden: dict[str, np.ndarray]) -> None:
    assert max_diff(whisper_logmel128(golden["wav16k"]), golden["whisper_logmel128"]) < TOLERANCE


def test_fbank80_matches_official(golden: dict[str, np.ndarray]) -> None:
    assert max_diff(fbank80(golden["wav16k"]), golden["fbank80"]) < TOLERANCE


def test_parity_module_passes(tiny_dir: Path) -> None:
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    results = feature_parity.run(model_dir, tiny_dir)
    assert [r.name for r in results][:3] == [
        "features mel24k",
        "features whisper_logmel128",
        "features fbank80",
    ]
    failed = [r for r in results if not r.passed]
    assert not failed, failed


@pytest.mark.parametrize("seconds", [0.5, 3.0, 7.31])
def test_shapes_follow_the_frame_rates(seconds: float) -> None:
    rng = np.random.default_rng(0)
    wav24k = (0.1 * rng.standard_normal(int(seconds * 24000))).astype(np.float32)
    wav16k = (0.1 * rng.standard_normal(int(seconds * 16000))).astype(np.float32)
    n24, n16 = len(wav24k), len(wav16k)
    # the reflect padding of (n_fft - hop) / 2 per side makes frames = 1 + (N - hop) // hop
    assert mel24k(wav24k).shape == (80, 1 + (n24 - 480) // 480)
    assert whisper_logmel128(wav16k).shape == (128, n16 // 160)
    assert fbank80(wav16k).shape == (1 + (n16 - 400) // 160, 80)
    for feature in (mel24k(wav24k), whisper_logmel128(wav16k), fbank80(wav16k)):
        assert feature.dtype == torch.float32 and torch.isfinite(feature).all()


def test_fbank80_is_mean_normalised_and_gain_invariant() -> None:
    wav = (0.1 * np.random.default_rng(1).standard_normal(16000)).astype(np.float32)
    feat = fbank80(wav)
    assert feat.mean(dim=0).abs().max() < 1e-4
    assert (fbank80(wav * 4.0) - feat).abs().max() < 1e-4  # a gain only shifts every log energy


def test_accepts_numpy_torch_float64_and_leading_batch_of_one() -> None:
    wav = 0.1 * np.random.default_rng(2).standard_normal(24000)
    reference = mel24k(wav.astype(np.float32))
    assert torch.allclose(mel24k(wav), reference, atol=1e-5)
    assert torch.allclose(mel24k(torch.from_numpy(wav).float()[None]), reference)


def test_rejects_multichannel_and_too_short_input() -> None:
    with pytest.raises(InputError, match="mono"):
        mel24k(np.zeros((2, 24000), dtype=np.float32))
    with pytest.raises(InputError, match="too short"):
        fbank80(np.zeros(100, dtype=np.float32))


def test_filter_banks_have_the_expected_layout() -> None:
    slaney = slaney_mel_filters(16000, 400, 128)
    assert slaney.shape == (128, 201) and slaney.dtype == np.float32
    assert (slaney.sum(axis=1) > 0).all()  # no empty filter at 128 bins / 400-point FFT
    # Slaney normalisation gives every triangle unit area in Hz; a sum over FFT bins shows it once the
    # triangles span many bins (the upper half of the 24 kHz flow filters)
    flow = slaney_mel_filters(24000, 1920, 80)
    areas = flow.sum(axis=1) * (24000 / 1920)
    assert np.allclose(areas[40:], 1.0, atol=0.02)
    kaldi = kaldi_mel_banks(80)
    assert kaldi.shape == (80, 257) and kaldi[:, -1].max() == 0.0 and kaldi.max() <= 1.0
