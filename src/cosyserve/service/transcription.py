"""The prompt transcriber a server uses: loaded on first use from the configured (or downloaded) ASR
directory, shared by the API (`transcribe=true`) and the web UI's "transcribe" button."""

from __future__ import annotations

import threading
from pathlib import Path

from cosyserve.errors import InputError
from cosyserve.frontend.asr import Recognizer, is_asr_dir, load_recognizer, transcribe_audio

_lock = threading.Lock()
_loaded: dict[Path, Recognizer] = {}


def asr_dir(configured: Path | None) -> Path:
    """The configured directory, else where `cosyserve download --asr` puts the model."""
    if configured is not None:
        return Path(configured).expanduser()
    from cosyserve.modeldir.asr_download import default_asr_dir

    return default_asr_dir()


def asr_available(configured: Path | None) -> bool:
    return is_asr_dir(asr_dir(configured))


def transcribe(configured: Path | None, audio: bytes | str | Path) -> str:
    """The words in `audio`; InputError when no model is there or nothing is recognised."""
    directory = asr_dir(configured)
    if not is_asr_dir(directory):
        raise InputError(
            f"no transcription model in {directory}: run `cosyserve download --asr` (and pip install "
            "'cosyserve[asr]'), or type the prompt's transcript"
        )
    with _lock:
        recognizer = _loaded.get(directory)
        if recognizer is None:
            recognizer = _loaded[directory] = load_recognizer(directory)
    return transcribe_audio(recognizer, audio)
