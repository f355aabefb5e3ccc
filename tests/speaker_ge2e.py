"""A real pretrained speaker encoder for tests: the GE2E network (Wan et al., "Generalized end-to-end loss
for speaker verification", 2018) with the weights the `resemblyzer` wheel ships (`resemblyzer/pretrained.pt`,
Apache-2.0).

Only the weights file is taken from the package: importing `resemblyzer` imports webrtcvad, which needs
`pkg_resources` (gone from setuptools 81 on), and librosa with numba. The network and its front-end are
written here from the file's tensor names and shapes and the package's published settings:
  - 16 kHz audio, power mel spectrogram: 40 bands (Slaney scale and area norm), 25 ms Hann window, 10 ms hop;
  - an LSTM of 3 layers (40 -> 256), the last layer's final hidden state -> Linear(256, 256) -> ReLU -> L2;
  - an utterance is embedded as the normalised mean of its 1.6 s (160-frame) windows.

encoder = GE2EEncoder.load()  # None when resemblyzer is not installed
embedding = encoder(audio, sample_rate)  # (1, 256), unit length
"""

from __future__ import annotations

import importlib.metadata
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from cosyserve.frontend.resampling import prompt_resample

SAMPLE_RATE = 16000
WINDOW = 400  # 25 ms
HOP = 160  # 10 ms
MEL_BANDS = 40
HIDDEN = 256
LAYERS = 3
PARTIAL_FRAMES = 160  # 1.6 s: the length the network was trained on
PARTIAL_STEP = 80  # windows overlap by half
TARGET_DBFS = -30.0  # speech is brought to this loudness first, as in training


def weights_path() -> Path | None:
    """`pretrained.pt` inside the installed resemblyzer distribution, found without importing it."""
    try:
        files = importlib.metadata.files("resemblyzer") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [Path(str(file.locate())) for file in files if file.name == "pretrained.pt"]
    return found[0] if found and found[0].is_file() else None


def _hz_to_slaney_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear (3 per 200 Hz) below 1 kHz, logarithmic above."""
    linear = 3.0 * hz / 200.0
    log_part = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (math.log(6.4) / 27.0)
    return np.where(hz >= 1000.0, log_part, linear)


def _slaney_mel_to_hz(mel: np.ndarray) -> np.ndarray:
    linear = 200.0 * mel / 3.0
    log_part = 1000.0 * np.exp((math.log(6.4) / 27.0) * (mel - 15.0))
    return np.where(mel >= 15.0, log_part, linear)


def mel_filterbank() -> torch.Tensor:
    """(MEL_BANDS, WINDOW // 2 + 1) triangles from 0 Hz to Nyquist, each of unit area (Slaney norm)."""
    bins_hz = np.linspace(0.0, SAMPLE_RATE / 2, WINDOW // 2 + 1)
    top_mel = float(_hz_to_slaney_mel(np.array(SAMPLE_RATE / 2)))
    edges_mel = np.linspace(0.0, top_mel, MEL_BANDS + 2)
    edges_hz = _slaney_mel_to_hz(edges_mel)
    lower, centre, upper = edges_hz[:-2, None], edges_hz[1:-1, None], edges_hz[2:, None]
    rising = (bins_hz[None] - lower) / (centre - lower)
    falling = (upper - bins_hz[None]) / (upper - centre)
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    triangles *= 2.0 / (upper - lower)
    return torch.from_numpy(triangles.astype(np.float32))


def mel_power(wav16k: torch.Tensor, filterbank: torch.Tensor) -> torch.Tensor:
    """(S,) 16 kHz audio -> (T, MEL_BANDS) mel power, frames centred on every hop (zero padded)."""
    spectrum = torch.stft(
        wav16k,
        n_fft=WINDOW,
        hop_length=HOP,
        window=torch.hann_window(WINDOW),
        center=True,
        pad_mode="constant",
        return_complex=True,
    )
    return (filterbank @ spectrum.abs().square()).T


class GE2ENetwork(nn.Module):
    """(B, T, 40) mel power -> (B, 256) unit-length speaker embeddings."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(MEL_BANDS, HIDDEN, num_layers=LAYERS, batch_first=True)
        self.linear = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        _, (hidden, _) = self.lstm(mels)
        projected = torch.relu(self.linear(hidden[-1]))
        return projected / projected.norm(dim=1, keepdim=True).clamp_min(1e-8)


def _partial_starts(frames: int) -> list[int]:
    """Where each 160-frame window starts; the last one ends with the utterance."""
    if frames <= PARTIAL_FRAMES:
        return [0]
    starts = list(range(0, frames - PARTIAL_FRAMES + 1, PARTIAL_STEP))
    if starts[-1] + PARTIAL_FRAMES < frames:
        starts.append(frames - PARTIAL_FRAMES)
    return starts


class GE2EEncoder:
    """The adapter: raw audio at any rate -> (1, 256), as `SpeakerEncoder` gives (1, 192) from fbank."""

    def __init__(self, network: GE2ENetwork) -> None:
        self.network = network.eval()
        self.filterbank = mel_filterbank()

    @classmethod
    def load(cls) -> GE2EEncoder | None:
        path = weights_path()
        if path is None:
            return None
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        state = {
            name: tensor
            for name, tensor in checkpoint["model_state"].items()
            if name.startswith(("lstm.", "linear."))  # the rest are the training loss's scale and bias
        }
        network = GE2ENetwork()
        network.load_state_dict(state)
        return cls(network)

    @torch.inference_mode()
    def __call__(self, audio: np.ndarray, sample_rate: int) -> torch.Tensor:
        """(S,) float audio at `sample_rate` -> (1, 256) unit-length embedding."""
        wav16k = prompt_resample(np.asarray(audio, np.float32), sample_rate, SAMPLE_RATE)
        rms = float(np.sqrt(np.mean(np.square(wav16k, dtype=np.float64))))
        wav16k = wav16k * (10 ** (TARGET_DBFS / 20) / max(rms, 1e-8))
        mels = mel_power(torch.from_numpy(np.ascontiguousarray(wav16k, np.float32)), self.filterbank)
        if len(mels) < PARTIAL_FRAMES:
            mels = torch.nn.functional.pad(mels, (0, 0, 0, PARTIAL_FRAMES - len(mels)))
        windows = torch.stack([mels[start : start + PARTIAL_FRAMES] for start in _partial_starts(len(mels))])
        mean = self.network(windows).mean(dim=0, keepdim=True)
        return mean / mean.norm().clamp_min(1e-8)
