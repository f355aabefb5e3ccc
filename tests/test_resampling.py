"""The official prompt resampler (torchaudio's windowed sinc, rebuilt in torch) against `resample.npz`.

Tolerances are measured on both CPU families that CI runs on: AVX-512 (this machine) and AVX2, emulated
with ATEN_CPU_CAPABILITY=avx2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from cosyserve.errors import InputError
from cosyserve.frontend import resampling
from cosyserve.frontend.resampling import (
    MAX_KERNEL_TAPS,
    kernel_taps,
    output_resample,
    prompt_resample,
    sinc_resample,
)

# Max |diff| against the official outputs over the eight pairs: 1.2e-7 on AVX-512 and on AVX2 (0.0 for
# 22.05/44.1/48 kHz, 6e-8..1.2e-7 from 8 kHz); the fixture's own tolerance is 1e-5.
RESAMPLE_TOLERANCE = 1e-5
PAIRS = [(orig, new) for orig in (8000, 22050, 44100, 48000) for new in (16000, 24000)]


@pytest.fixture(scope="module")
def golden(tiny_dir: Path) -> dict[str, np.ndarray]:
    with np.load(tiny_dir / "resample.npz") as data:
        return {key: data[key] for key in data.files}


@pytest.mark.parametrize(("orig", "new"), PAIRS)
def test_matches_the_official_resampler(golden: dict[str, np.ndarray], orig: int, new: int) -> None:
    ours = prompt_resample(golden[f"in_{orig}"], orig, new)
    expected = golden[f"out_{orig}_{new}"]
    assert ours.dtype == np.float32 and ours.shape == expected.shape
    assert np.abs(ours - expected).max() <= RESAMPLE_TOLERANCE


def test_batches_dtypes_and_same_rate(golden: dict[str, np.ndarray]) -> None:
    wave = torch.from_numpy(golden["in_44100"])
    batch = torch.stack([wave, -wave])[None]  # (1, 2, N)
    out = sinc_resample(batch, 44100, 16000)
    assert out.shape == (1, 2, 32000)
    assert torch.equal(out[0, 0], sinc_resample(wave, 44100, 16000))
    assert torch.equal(out[0, 1], -out[0, 0])
    double = sinc_resample(wave.double(), 44100, 16000)
    assert double.dtype == torch.float64
    assert (double - torch.from_numpy(golden["out_44100_16000"]).double()).abs().max() < RESAMPLE_TOLERANCE
    assert sinc_resample(wave, 44100, 44100) is wave
    assert sinc_resample(torch.zeros(1, 0), 44100, 16000).shape == (1, 0)
    odd = sinc_resample(torch.ones(7), 3, 2)  # ceil(7 * 2 / 3) = 5 samples
    assert odd.shape == (5,)


def test_kernel_built_once_per_pair_across_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    resampling._cache.clear()
    built: list[tuple[int, int]] = []
    real = resampling.sinc_kernel

    def counting(orig: int, new: int) -> torch.Tensor:
        built.append((orig, new))
        return real(orig, new)

    monkeypatch.setattr(resampling, "sinc_kernel", counting)
    wave = torch.randn(22050, generator=torch.Generator().manual_seed(0))
    results: list[torch.Tensor] = []
    barrier = threading.Barrier(8)

    def work() -> None:
        barrier.wait()
        results.append(sinc_resample(wave, 22050, 16000))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert built == [(441, 320)]
    assert len(results) == 8 and all(torch.equal(r, results[0]) for r in results)
    sinc_resample(wave, 22050, 16000)
    assert built == [(441, 320)]


def test_cache_is_bounded() -> None:
    resampling._cache.clear()
    for rate in range(16001, 16001 + 2 * resampling.KERNEL_CACHE_SIZE):
        if kernel_taps(rate, 16000) <= MAX_KERNEL_TAPS:
            sinc_resample(torch.zeros(100), 16000, rate)
    assert len(resampling._cache) <= resampling.KERNEL_CACHE_SIZE


def test_odd_rate_pairs_fall_back_to_soxr() -> None:
    assert kernel_taps(11127, 16000) > MAX_KERNEL_TAPS  # an old Macintosh rate: 178 M taps
    tone = np.sin(2 * np.pi * 300.0 * np.arange(11127) / 11127).astype(np.float32)
    with pytest.raises(InputError, match="common rate"):
        sinc_resample(torch.from_numpy(tone), 11127, 16000)
    out = prompt_resample(tone, 11127, 16000)
    assert np.array_equal(out, output_resample(tone, 11127, 16000))
    with pytest.raises(InputError, match="positive"):
        prompt_resample(tone, 0, 16000)
    with pytest.raises(InputError, match="float"):
        sinc_resample(torch.zeros(10, dtype=torch.int16), 8000, 16000)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("orig", "new"), PAIRS)
def test_cuda_matches_the_official_resampler(golden: dict[str, np.ndarray], orig: int, new: int) -> None:
    wave = torch.from_numpy(golden[f"in_{orig}"]).cuda()
    out = sinc_resample(wave, orig, new)
    assert out.is_cuda
    assert np.abs(out.cpu().numpy() - golden[f"out_{orig}_{new}"]).max() <= RESAMPLE_TOLERANCE
