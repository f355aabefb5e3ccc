"""Prompt cleanup: the SNR estimate and its warning, too-quiet prompts named as such, RNNoise denoising
(really run: its weights ship in the pyrnnoise wheel) that leaves a clean prompt's level within 1 dB."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile

from cosyserve.errors import InputError
from cosyserve.frontend.audio import decode_audio, speech_rms_db
from cosyserve.frontend.prompt_check import NOISY_BELOW_SNR_DB, check_prompt, estimate_snr_db


def _prompt(shared_dir: Path) -> tuple[np.ndarray, int]:
    samples, rate = soundfile.read(shared_dir / "audio" / "prompt_zh_24k.wav", dtype="float32")
    return samples, rate


def _wav(samples: np.ndarray, rate: int) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV")
    return buffer.getvalue()


def with_noise(samples: np.ndarray, snr_db: float, seed: int = 0) -> np.ndarray:
    rms = float(np.sqrt(np.mean(samples**2)))
    noise = np.random.default_rng(seed).standard_normal(len(samples)).astype(np.float32)
    return np.clip(samples + noise * rms * 10 ** (-snr_db / 20), -1, 1).astype(np.float32)


def test_snr_estimate_follows_added_noise(shared_dir: Path) -> None:
    samples, rate = _prompt(shared_dir)
    assert estimate_snr_db(samples, rate) >= 50  # a clean studio prompt
    for added in (30.0, 15.0, 5.0):
        assert abs(estimate_snr_db(with_noise(samples, added), rate) - added) < 3.0


def test_noisy_prompt_is_accepted_with_a_warning(shared_dir: Path) -> None:
    samples, rate = _prompt(shared_dir)
    report = check_prompt(decode_audio(_wav(with_noise(samples, 10.0), rate)))
    assert report.snr_db < NOISY_BELOW_SNR_DB
    assert any("noisy recording" in warning for warning in report.warnings)
    assert not any("noisy" in w for w in check_prompt(decode_audio(_wav(samples, rate))).warnings)


def test_too_quiet_is_not_called_too_short(shared_dir: Path) -> None:
    samples, rate = _prompt(shared_dir)
    quiet = samples / np.abs(samples).max() * 10 ** (-50 / 20)  # peak at -50 dBFS
    with pytest.raises(InputError, match="too quiet") as refused:
        check_prompt(decode_audio(_wav(quiet, rate)))
    assert "long" not in str(refused.value)
    short = np.concatenate([samples[:rate], np.zeros(rate, np.float32)])  # really 1 s of speech
    with pytest.raises(InputError, match="only"):
        check_prompt(decode_audio(_wav(short, rate)))


def test_denoise_keeps_a_clean_prompt_and_cleans_a_noisy_one(shared_dir: Path) -> None:
    pytest.importorskip("pyrnnoise")
    from cosyserve.frontend.denoise import denoise

    for name in ("prompt_zh_24k.wav", "prompt_b_22k.wav"):
        samples, rate = soundfile.read(shared_dir / "audio" / name, dtype="float32")
        cleaned = denoise(samples, rate)
        assert cleaned.shape == samples.shape
        change = speech_rms_db(cleaned, rate) - speech_rms_db(samples, rate)
        assert abs(change) < 1.0, f"{name}: level changed by {change:.2f} dB"
        lag = np.argmax(np.correlate(cleaned[: 2 * rate], samples[: 2 * rate][2000:-2000], "valid")) - 2000
        assert lag == 0  # no delay added
    samples, rate = _prompt(shared_dir)
    noisy = with_noise(samples, 10.0)
    assert estimate_snr_db(denoise(noisy, rate), rate) > estimate_snr_db(noisy, rate) + 15


def test_denoise_without_the_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from cosyserve.frontend import denoise as module

    def missing(name: str) -> None:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(importlib, "import_module", missing)
    assert not module.denoise_available()
    with pytest.raises(InputError, match=r"cosyserve\[denoise\]"):
        module.denoise(np.zeros(100, np.float32), 24000)


def test_a_dc_offset_is_removed_before_the_checks(shared_dir: Path) -> None:
    """A +0.05 offset on a prompt padded with half a second of silence: nothing was trimmed, the advice
    was "no trailing silence" and "noisy recording", the offset being the "noise"."""
    from cosyserve.frontend.prompt_check import load_prompt

    samples, rate = _prompt(shared_dir)
    pad = np.zeros(rate // 2, np.float32)
    clean = np.concatenate([pad, samples, pad])
    audio, report = load_prompt(_wav(clean + np.float32(0.05), rate))
    expected = check_prompt(decode_audio(_wav(clean, rate)))
    assert abs(float(np.mean(audio.samples))) < 1e-3
    assert report.warnings == expected.warnings == ()
    assert report.trailing_silence_s == pytest.approx(expected.trailing_silence_s, abs=0.03)
    assert abs(report.snr_db - expected.snr_db) < 1.0
    untouched, _ = load_prompt(_wav(clean, rate))  # a real recording's tiny mean is left alone
    assert np.array_equal(untouched.samples, decode_audio(_wav(clean, rate)).samples)
