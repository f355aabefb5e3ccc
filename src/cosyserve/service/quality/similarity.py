"""Speaker similarity: the CAM++ embedding of the output, made exactly as the prompt's is (resampled to
16 kHz with the prompt resampler, Kaldi fbank with the mean removed, `campplus.onnx`), against the prompt's.
"""

from __future__ import annotations

import numpy as np
import torch

from cosyserve.frontend.features import fbank80
from cosyserve.frontend.onnx_models import SpeakerEncoder
from cosyserve.frontend.prompt_features import TOKENIZER_SAMPLE_RATE
from cosyserve.frontend.resampling import prompt_resample

MIN_SECONDS = 0.5  # shorter and there are too few frames for an embedding


def speaker_embedding(encoder: SpeakerEncoder, audio: np.ndarray, sample_rate: int) -> torch.Tensor | None:
    """(S,) float audio at `sample_rate` -> (1, 192) embedding; None when it is too short."""
    if len(audio) < MIN_SECONDS * sample_rate:
        return None
    wav16k = prompt_resample(np.asarray(audio, np.float32), sample_rate, TOKENIZER_SAMPLE_RATE)
    return encoder(fbank80(wav16k))


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine of two (1, D) embeddings."""
    a, b = a.reshape(-1).double(), b.reshape(-1).double()
    denominator = float(a.norm() * b.norm())
    return float(a @ b) / denominator if denominator > 0 else 0.0
