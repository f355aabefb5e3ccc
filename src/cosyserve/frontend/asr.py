"""Transcribing a prompt recording, so zero-shot cloning works without typing what it says.

The real recogniser is SenseVoice-Small (FunAudioLLM, the same family as CosyVoice) exported for
sherpa-onnx (`pip install 'cosyserve[asr]'`; weights with `cosyserve download --asr`): a directory with
`model.int8.onnx` (or `model.onnx`) and `tokens.txt`. A directory holding `standin-asr.json` instead is a
stand-in with the same interface, for tests and offline tries: it answers the transcript written there.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Protocol

import numpy as np

from cosyserve.errors import InputError
from cosyserve.frontend.audio import decode_audio
from cosyserve.frontend.resampling import prompt_resample

ASR_SAMPLE_RATE = 16_000
STANDIN_FILE = "standin-asr.json"
MODEL_FILES = ("model.int8.onnx", "model.onnx")
TOKENS_FILE = "tokens.txt"
# SenseVoice prefixes its text with language/emotion/event tags such as <|zh|><|NEUTRAL|><|Speech|>.
_TAGS = re.compile(r"<\|[^|]*\|>")


class Recognizer(Protocol):
    """Speech (N,) float32 at 16 kHz -> the words said."""

    def transcribe(self, samples: np.ndarray) -> str: ...


class StandInRecognizer:
    """The stand-in: answers `{"transcript": …}` from its JSON file for any audio."""

    def __init__(self, model_dir: Path) -> None:
        data = json.loads((model_dir / STANDIN_FILE).read_text(encoding="utf-8"))
        self.transcript = str(data.get("transcript", ""))

    def transcribe(self, samples: np.ndarray) -> str:
        del samples
        return self.transcript


class SenseVoiceRecognizer:
    """SenseVoice-Small through sherpa-onnx (CPU, inverse text normalisation on: digits as written)."""

    def __init__(self, model_dir: Path, threads: int = 2) -> None:
        try:
            import sherpa_onnx
        except ImportError as exc:
            raise InputError("transcription needs the asr extra: pip install 'cosyserve[asr]'") from exc
        model = next((model_dir / name for name in MODEL_FILES if (model_dir / name).is_file()), None)
        if model is None or not (model_dir / TOKENS_FILE).is_file():
            raise InputError(
                f"{model_dir} is not a SenseVoice model directory: run `cosyserve download --asr`"
            )
        self._recognizer = sherpa_onnx.OfflineRecognizer.from_sense_voice(
            model=str(model), tokens=str(model_dir / TOKENS_FILE), num_threads=threads, use_itn=True
        )
        self._lock = threading.Lock()

    def transcribe(self, samples: np.ndarray) -> str:
        with self._lock:
            stream = self._recognizer.create_stream()
            stream.accept_waveform(ASR_SAMPLE_RATE, np.asarray(samples, dtype=np.float32))
            self._recognizer.decode_stream(stream)
            return _TAGS.sub("", stream.result.text).strip()


def is_asr_dir(model_dir: Path) -> bool:
    """A stand-in, or a SenseVoice export (model and tokens present)."""
    if (model_dir / STANDIN_FILE).is_file():
        return True
    return (model_dir / TOKENS_FILE).is_file() and any((model_dir / name).is_file() for name in MODEL_FILES)


def load_recognizer(model_dir: Path) -> Recognizer:
    """The recogniser in `model_dir` (InputError naming what is missing)."""
    if (model_dir / STANDIN_FILE).is_file():
        return StandInRecognizer(model_dir)
    return SenseVoiceRecognizer(model_dir)


def transcribe_audio(recognizer: Recognizer, audio: bytes | str | Path) -> str:
    """The transcript of a recording (any format the prompt decoder reads); InputError when none is heard."""
    decoded = decode_audio(audio)
    samples = prompt_resample(decoded.samples, decoded.sample_rate, ASR_SAMPLE_RATE)
    text = recognizer.transcribe(np.asarray(samples, dtype=np.float32)).strip()
    if not text:
        raise InputError("no speech was recognised in the recording: type its transcript instead")
    return text
