"""Prompt audio: decoding every supported format, validation messages, trimming and normalisation."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile

from cosyserve.errors import InputError
from cosyserve.frontend.audio import (
    LEAD_MARGIN_S,
    MAX_GAIN_DB,
    TARGET_SPEECH_RMS_DBFS,
    TRAIL_MARGIN_S,
    decode_audio,
    find_speech_span,
    normalise_loudness,
    peak_db,
    speech_rms_db,
    trim_silence,
)
from cosyserve.frontend.prompt_check import check_prompt, load_prompt
from cosyserve.frontend.resampling import output_resample, prompt_resample


def speech_like(
    seconds: float, sr: int, *, lead: float = 0.4, trail: float = 0.5, level: float = 0.3, seed: int = 0
) -> np.ndarray:
    """Syllable-like harmonic bursts (gliding f0, 5 harmonics, breath noise) between silent margins: (N,)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    f0 = 140.0 + 30.0 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voiced = sum(np.sin(k * phase) / k for k in range(1, 6) if k * 300 < sr / 2)
    envelope = np.clip(np.sin(2 * np.pi * 3.0 * t), 0.05, None) ** 0.5  # ~6 syllables a second
    body = level * envelope * (voiced / 2.0 + 0.05 * rng.standard_normal(t.size))
    silence = lambda s: 1e-4 * rng.standard_normal(int(s * sr))  # noqa: E731 - a quiet room, not digital zero
    return np.concatenate([silence(lead), body, silence(trail)]).astype(np.float32)


def encode(samples: np.ndarray, sr: int, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, sr, format=fmt, subtype=subtype)
    return buffer.getvalue()


# ---- decoding ----


@pytest.mark.parametrize(
    ("fmt", "subtype"),
    [("WAV", "PCM_16"), ("WAV", "FLOAT"), ("FLAC", None), ("OGG", "VORBIS"), ("MP3", None)],
)
def test_decodes_supported_formats(fmt: str, subtype: str | None) -> None:
    if fmt not in soundfile.available_formats():
        pytest.skip(f"this libsndfile ({soundfile.__libsndfile_version__}) cannot handle {fmt}")
    samples = speech_like(4.0, 24000)
    try:
        data = encode(samples, 24000, fmt, subtype)
    except (soundfile.LibsndfileError, RuntimeError, ValueError) as exc:
        pytest.skip(f"this libsndfile cannot write {fmt}: {exc}")
    audio = decode_audio(data)
    assert audio.sample_rate == 24000
    assert audio.format == fmt
    assert audio.samples.dtype == np.float32 and audio.samples.ndim == 1
    # lossy codecs add encoder delay/padding; the duration must still be about right
    assert abs(audio.duration_s - len(samples) / 24000) < 0.1
    check_prompt(audio)


def test_decodes_paths_and_file_objects(tmp_path: Path) -> None:
    samples = speech_like(4.0, 16000)
    path = tmp_path / "prompt.flac"
    soundfile.write(path, samples, 16000)
    assert np.allclose(decode_audio(path).samples, samples, atol=1e-4)
    assert np.allclose(decode_audio(str(path)).samples, samples, atol=1e-4)
    with path.open("rb") as handle:
        assert decode_audio(handle).sample_rate == 16000


def test_multichannel_is_averaged() -> None:
    left = speech_like(4.0, 24000)
    stereo = np.stack([left, np.zeros_like(left)], axis=1)
    audio = decode_audio(encode(stereo, 24000, "WAV", "FLOAT"))
    assert audio.channels == 2
    assert np.allclose(audio.samples, left / 2, atol=1e-6)


# ---- rejections: each message says what was wrong ----


def test_rejects_empty_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="empty"):
        load_prompt(empty)
    with pytest.raises(InputError, match="empty"):
        load_prompt(b"")


def test_rejects_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        load_prompt(tmp_path / "nope.wav")


@pytest.mark.parametrize(
    "payload",
    [
        b"not audio at all" * 100,
        encode(speech_like(4.0, 16000), 16000)[:30],
        np.random.default_rng(1).bytes(5000),
    ],
    ids=["text", "truncated-header", "random"],
)
def test_rejects_corrupt_bytes(payload: bytes) -> None:
    with pytest.raises(InputError, match=r"could not be decoded.*WAV, FLAC"):
        load_prompt(payload)


def test_rejects_header_without_samples() -> None:
    with pytest.raises(InputError, match="no samples"):
        load_prompt(encode(np.zeros(0, dtype=np.float32), 16000))


def test_rejects_too_short() -> None:
    with pytest.raises(InputError, match=r"only 1\.\d s long after trimming silence.*at least 3 s"):
        load_prompt(encode(speech_like(1.0, 16000), 16000))


def test_short_prompt_with_long_silence_is_still_too_short() -> None:
    """Silence does not count: 2 s of sound padded with 5 s of silence is rejected."""
    with pytest.raises(InputError, match=r"only 2\.\d s long"):
        load_prompt(encode(speech_like(2.0, 16000, lead=2.5, trail=2.5), 16000))


def test_rejects_too_long() -> None:
    with pytest.raises(InputError, match=r"40\.\d s of sound.*at most 30 s"):
        load_prompt(encode(speech_like(40.0, 16000), 16000))


def test_rejects_very_long_file_without_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "long.wav"
    with soundfile.SoundFile(path, "w", samplerate=8000, channels=1, subtype="PCM_16") as sound:
        sound.write(np.zeros(601 * 8000, dtype=np.int16))
    with pytest.raises(InputError, match="10 minutes long"):
        load_prompt(path)


@pytest.mark.parametrize("noise", [0.0, 1e-5], ids=["digital-zero", "room-hiss"])
def test_rejects_silence(noise: float) -> None:
    samples = noise * np.random.default_rng(0).standard_normal(5 * 16000).astype(np.float32)
    with pytest.raises(InputError, match=r"silent.*microphone"):
        load_prompt(encode(samples, 16000, "WAV", "FLOAT"))


def test_rejects_heavy_clipping() -> None:
    clipped = np.clip(speech_like(5.0, 16000) * 20.0, -1.0, 1.0)
    with pytest.raises(InputError, match=r"clipped \(\d+\.\d% of samples at full scale\).*gain"):
        load_prompt(encode(clipped, 16000))


@pytest.mark.parametrize("sr", [4000, 384000])
def test_rejects_sample_rate_out_of_range(sr: int) -> None:
    with pytest.raises(InputError, match=f"sample rate is {sr} Hz"):
        load_prompt(encode(speech_like(4.0, sr), sr, "WAV", "FLOAT"))


def test_rejects_non_finite_samples() -> None:
    samples = speech_like(4.0, 16000)
    samples[100] = np.nan
    with pytest.raises(InputError, match="NaN"):
        load_prompt(encode(samples, 16000, "WAV", "FLOAT"))


# ---- acceptance ----


def test_accepts_8khz_mono_with_warning() -> None:
    _, report = load_prompt(encode(speech_like(5.0, 8000), 8000))
    assert report.sample_rate == 8000 and report.channels == 1
    assert 5.0 <= report.duration_s <= 5.0 + LEAD_MARGIN_S + TRAIL_MARGIN_S + 0.05
    assert any("low sample rate" in w for w in report.warnings)


def test_accepts_96khz_six_channels() -> None:
    channels = np.stack([speech_like(6.0, 96000, seed=c) * (0.5 + 0.1 * c) for c in range(6)], axis=1)
    audio, report = load_prompt(encode(channels, 96000, "WAV", "PCM_24"))
    assert (report.sample_rate, report.channels) == (96000, 6)
    assert audio.samples.ndim == 1
    assert report.warnings == ()


def test_warns_without_trailing_silence() -> None:
    _, report = load_prompt(encode(speech_like(5.0, 16000, trail=0.0), 16000))
    assert report.trailing_silence_s < 0.1
    assert any("no trailing silence" in w for w in report.warnings)


def test_warns_about_quiet_and_mildly_clipped_prompts() -> None:
    _, quiet = load_prompt(encode(speech_like(5.0, 16000, level=0.004), 16000, "WAV", "FLOAT"))
    assert any("very quiet" in w for w in quiet.warnings)
    samples = speech_like(5.0, 16000)
    samples[::400] = 1.0  # 0.25% of samples at full scale
    _, clipped = load_prompt(encode(samples, 16000, "WAV", "FLOAT"))
    assert any("some clipping" in w for w in clipped.warnings)


@pytest.mark.parametrize(("name", "sr"), [("prompt_zh_24k.wav", 24000), ("prompt_b_22k.wav", 22050)])
def test_real_prompts_are_accepted(shared_dir: Path, name: str, sr: int) -> None:
    _, report = load_prompt(shared_dir / "audio" / name)
    assert report.sample_rate == sr and report.channels == 1
    assert 3.0 <= report.duration_s <= report.original_duration_s
    assert report.speech_s <= report.duration_s
    assert -30.0 < report.rms_dbfs < -10.0 and report.peak_dbfs <= 0.0
    assert 0.1 < report.leading_silence_s < 1.0 and 0.1 < report.trailing_silence_s < 1.0
    assert report.clipping_ratio < 1e-4
    assert report.warnings == ()
    assert report.as_dict()["warnings"] == []


# ---- trimming, normalisation, resampling ----


def test_trim_keeps_short_margins() -> None:
    sr = 16000
    samples = speech_like(3.0, sr, lead=2.0, trail=2.0)
    span = find_speech_span(samples, sr)
    assert abs(span.start / sr - 2.0) < 0.03 and abs((span.total - span.end) / sr - 2.0) < 0.03
    trimmed = trim_silence(samples, sr)
    assert abs(len(trimmed) / sr - (3.0 + LEAD_MARGIN_S + TRAIL_MARGIN_S)) < 0.05
    capped = trim_silence(samples, sr, max_duration_s=3.2)
    assert len(capped) <= round(3.2 * sr) and len(capped) >= span.end - span.start


def test_normalise_loudness_targets_speech_rms_and_respects_the_peak_ceiling() -> None:
    sr = 16000
    quiet = speech_like(4.0, sr, level=0.05)  # speech at about -30 dBFS
    louder = normalise_loudness(quiet, sr)
    assert abs(speech_rms_db(louder, sr) - TARGET_SPEECH_RMS_DBFS) < 0.1
    very_quiet = speech_like(4.0, sr, level=0.005)  # would need about +30 dB: capped
    assert abs(peak_db(normalise_loudness(very_quiet, sr)) - peak_db(very_quiet) - MAX_GAIN_DB) < 0.01
    hot = speech_like(4.0, sr, level=0.9)
    assert abs(speech_rms_db(normalise_loudness(hot, sr), sr) - TARGET_SPEECH_RMS_DBFS) < 0.1
    spiky = speech_like(4.0, sr, level=0.05)
    spiky[1000] = 0.9
    limited = normalise_loudness(spiky, sr)
    assert peak_db(limited) <= -1.0 + 1e-3
    silent = np.zeros(sr, dtype=np.float32)
    assert normalise_loudness(silent, sr) is silent


@pytest.mark.parametrize("resample", [prompt_resample, output_resample])
@pytest.mark.parametrize(("src", "dst"), [(8000, 16000), (22050, 24000), (96000, 16000), (24000, 24000)])
def test_resample_lengths_and_content(src: int, dst: int, resample) -> None:
    t = np.arange(src) / src
    tone = (0.5 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
    out = resample(tone, src, dst)
    assert out.dtype == np.float32 and abs(len(out) - dst) <= 1
    expected = 0.5 * np.sin(2 * np.pi * 440.0 * np.arange(len(out)) / dst)
    assert np.abs(out - expected)[200:-200].max() < 1e-3
