"""The intelligibility check's ASR: the server's prompt transcriber (`service.transcription`, the
`cosyserve[asr]` extra and `cosyserve download --asr`), run on each take when `quality.asr` is on."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import soundfile as sf

from cosyserve.service.quality.scorer import Transcriber

log = logging.getLogger(__name__)


def server_transcriber(asr_model: Path | None) -> Transcriber | None:
    """A transcriber over the configured (or downloaded) ASR model; None, with a warning, when none is
    installed (the check is then left out, as if it were off)."""
    from cosyserve.service import transcription

    if not transcription.asr_available(asr_model):
        log.warning("quality.asr is on but no ASR model is installed: the intelligibility check is off")
        return None

    def transcribe(audio: np.ndarray, sample_rate: int) -> str:
        buffer = io.BytesIO()
        sf.write(buffer, audio, sample_rate, format="WAV", subtype="FLOAT")
        return transcription.transcribe(asr_model, buffer.getvalue())

    return transcribe
