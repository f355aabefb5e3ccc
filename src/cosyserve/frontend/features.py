"""The three prompt features, in pure torch (any device, float32), matching the official front end.

- `mel24k`: the flow's prompt mel (Matcha-TTS `mel_spectrogram` with the `feat_extractor` settings of
  `cosyvoice3.yaml`), 80 Slaney mel bins of the 24 kHz waveform, 50 frames per second.
- `whisper_logmel128`: the speech tokenizer's input, Whisper's 128-bin log-mel of the 16 kHz waveform,
  100 frames per second.
- `fbank80`: the speaker encoder's input, Kaldi-style log mel filterbank energies of the 16 kHz waveform
  (`torchaudio.compliance.kaldi.fbank` defaults with 80 bins and no dither), mean over time removed.

Filter banks are built once in float64 numpy, cached per (parameters), and moved to the input's device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from cosyserve.errors import InputError


@dataclass(frozen=True)
class FlowMelSpec:
    """STFT and mel settings of the flow's prompt feature (the YAML's `feat_extractor`)."""

    sample_rate: int = 24000
    n_fft: int = 1920
    hop_length: int = 480  # 50 frames per second: two mel frames per 25 Hz speech token
    win_length: int = 1920
    n_mels: int = 80
    fmin: float = 0.0
    fmax: float | None = None  # None: Nyquist


FLOW_MEL_24K = FlowMelSpec()

WHISPER_SAMPLE_RATE = 16000
WHISPER_N_FFT = 400
WHISPER_HOP = 160

KALDI_SAMPLE_RATE = 16000
KALDI_FRAME_LENGTH = 400  # 25 ms
KALDI_FRAME_SHIFT = 160  # 10 ms
KALDI_PADDED_FFT = 512  # frame length rounded up to a power of two
KALDI_PREEMPHASIS = 0.97
KALDI_LOW_FREQ = 20.0


# ---- mel filter banks (numpy, float64, cached) ----


def _hz_to_slaney_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz / (200.0 / 3.0)
    log_part = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (math.log(6.4) / 27.0)
    return np.where(hz >= 1000.0, log_part, linear)


def _slaney_mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    linear = mel * (200.0 / 3.0)
    log_part = 1000.0 * np.exp((math.log(6.4) / 27.0) * (mel - 15.0))
    return np.where(mel >= 15.0, log_part, linear)


@lru_cache(maxsize=16)
def slaney_mel_filters(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None
) -> np.ndarray:
    """Triangular mel filters with Slaney area normalisation (librosa's default `filters.mel`).

    Returns (n_mels, n_fft // 2 + 1) float32; read-only because it is cached.
    """
    fmax = sample_rate / 2.0 if fmax is None else float(fmax)
    fft_freqs = np.fft.rfftfreq(n_fft, d=1.0 / sample_rate)
    edges_hz = _slaney_mel_to_hz(np.linspace(_hz_to_slaney_mel(fmin), _hz_to_slaney_mel(fmax), n_mels + 2))
    widths = np.diff(edges_hz)
    offsets = edges_hz[:, None] - fft_freqs[None, :]  # (n_mels + 2, F)
    rising = -offsets[:-2] / widths[:-1, None]
    falling = offsets[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    weights *= (2.0 / (edges_hz[2:] - edges_hz[:-2]))[:, None]  # equal area per filter
    weights = weights.astype(np.float32)
    weights.flags.writeable = False
    return weights


def _kaldi_mel(hz: np.ndarray | float) -> np.ndarray:
    return 1127.0 * np.log(1.0 + np.asarray(hz, dtype=np.float64) / 700.0)


@lru_cache(maxsize=4)
def kaldi_mel_banks(
    n_mels: int = 80,
    padded_fft: int = KALDI_PADDED_FFT,
    sample_rate: int = KALDI_SAMPLE_RATE,
    low_freq: float = KALDI_LOW_FREQ,
) -> np.ndarray:
    """Kaldi's triangular filters, equally spaced on its mel scale from `low_freq` to Nyquist, unnormalised.

    Returns (n_mels, padded_fft // 2 + 1) float32 (the Nyquist bin has zero weight, as in Kaldi).
    """
    num_bins = padded_fft // 2
    mel_low, mel_high = _kaldi_mel(low_freq), _kaldi_mel(sample_rate / 2.0)
    delta = (mel_high - mel_low) / (n_mels + 1)
    index = np.arange(n_mels, dtype=np.float64)[:, None]
    left, center, right = (
        mel_low + index * delta,
        mel_low + (index + 1) * delta,
        mel_low + (index + 2) * delta,
    )
    mel = _kaldi_mel((sample_rate / padded_fft) * np.arange(num_bins, dtype=np.float64))[None, :]
    rising = (mel - left) / (center - left)
    falling = (right - mel) / (right - center)
    banks = np.zeros((n_mels, num_bins + 1), dtype=np.float32)
    banks[:, :num_bins] = np.maximum(0.0, np.minimum(rising, falling))
    banks.flags.writeable = False
    return banks


def _on(array: np.ndarray, like: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.from_numpy(np.array(array)).to(device=like.device, dtype=dtype)


def _as_mono_float(wav: torch.Tensor | np.ndarray, what: str, min_samples: int) -> torch.Tensor:
    wav = torch.as_tensor(wav)
    if wav.dim() == 2 and wav.shape[0] == 1:
        wav = wav[0]
    if wav.dim() != 1:
        raise InputError(
            f"{what} expects a mono waveform of shape (N,), got {tuple(wav.shape)}; mix to mono first"
        )
    if wav.numel() < min_samples:
        raise InputError(
            f"{what} needs at least {min_samples} samples, got {wav.numel()}; the audio is too short"
        )
    return wav.to(torch.float32)


# ---- features ----


def mel24k(wav: torch.Tensor | np.ndarray, spec: FlowMelSpec = FLOW_MEL_24K) -> torch.Tensor:
    """Flow prompt mel of a 24 kHz waveform: (N,) -> (80, T), T = N // hop for N a multiple of hop.

    Reflect-padded by (n_fft - hop) / 2 on both sides, uncentred Hann STFT, magnitude with a 1e-9 floor
    inside the square root, Slaney mel, natural log clamped at 1e-5.
    """
    wav = _as_mono_float(wav, "mel24k", spec.n_fft // 2 + 1)
    pad = (spec.n_fft - spec.hop_length) // 2
    padded = torch.nn.functional.pad(wav[None, None], (pad, pad), mode="reflect")[0, 0]
    window = torch.hann_window(spec.win_length, device=wav.device, dtype=torch.float32)
    stft = torch.stft(
        padded,
        spec.n_fft,
        hop_length=spec.hop_length,
        win_length=spec.win_length,
        window=window,
        center=False,
        onesided=True,
        return_complex=True,
    )
    magnitude = torch.sqrt(stft.real.square() + stft.imag.square() + 1e-9)  # (F, T)
    filters = _on(slaney_mel_filters(spec.sample_rate, spec.n_fft, spec.n_mels, spec.fmin, spec.fmax), wav)
    return torch.log(torch.clamp(filters @ magnitude, min=1e-5))


def whisper_logmel128(wav16k: torch.Tensor | np.ndarray, n_mels: int = 128) -> torch.Tensor:
    """Whisper's log-mel of a 16 kHz waveform: (N,) -> (n_mels, N // 160).

    Centred (reflect) Hann STFT with n_fft 400 / hop 160, last frame dropped, power spectrum, Slaney mel,
    log10 clamped at 1e-10, floored at (max - 8), then (x + 4) / 4.
    """
    wav = _as_mono_float(wav16k, "whisper_logmel128", WHISPER_N_FFT // 2 + 1)
    window = torch.hann_window(WHISPER_N_FFT, device=wav.device, dtype=torch.float32)
    stft = torch.stft(wav, WHISPER_N_FFT, WHISPER_HOP, window=window, center=True, return_complex=True)
    power = stft[:, :-1].abs() ** 2
    filters = _on(slaney_mel_filters(WHISPER_SAMPLE_RATE, WHISPER_N_FFT, n_mels), wav)
    log_spec = torch.clamp(filters @ power, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def fbank80(wav16k: torch.Tensor | np.ndarray, n_mels: int = 80) -> torch.Tensor:
    """Kaldi fbank of a 16 kHz waveform with the time mean removed: (N,) -> (1 + (N - 400) // 160, n_mels).

    Per 25 ms frame (10 ms shift, edges snipped): remove the DC offset, pre-emphasis 0.97 (first sample
    against itself), Povey window (Hann ** 0.85), zero-pad to 512, power spectrum, Kaldi mel banks,
    natural log floored at float32 epsilon. Input is in [-1, 1] (no 32768 scaling, like torchaudio).

    Computed in float64 where the device has it: pre-emphasis leaves the lowest bins up to 1e-8 below the
    frame's energy, where float32 FFT rounding alone moves their log by ~1e-3 between machines.
    """
    wav = _as_mono_float(wav16k, "fbank80", KALDI_FRAME_LENGTH)
    wav = wav.to(torch.float32 if wav.device.type == "mps" else torch.float64)
    frames = wav.unfold(0, KALDI_FRAME_LENGTH, KALDI_FRAME_SHIFT)  # (T, 400)
    frames = frames - frames.mean(dim=1, keepdim=True)
    previous = torch.cat([frames[:, :1], frames[:, :-1]], dim=1)
    frames = frames - KALDI_PREEMPHASIS * previous
    povey = torch.hann_window(KALDI_FRAME_LENGTH, periodic=False, device=wav.device, dtype=wav.dtype) ** 0.85
    frames = torch.nn.functional.pad(frames * povey, (0, KALDI_PADDED_FFT - KALDI_FRAME_LENGTH))
    power = torch.fft.rfft(frames).abs() ** 2  # (T, 257)
    banks = _on(kaldi_mel_banks(n_mels), wav, wav.dtype)
    energies = torch.clamp(power @ banks.T, min=torch.finfo(torch.float32).eps).log()
    return (energies - energies.mean(dim=0, keepdim=True)).to(torch.float32)
