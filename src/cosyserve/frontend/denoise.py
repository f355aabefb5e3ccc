"""Noise reduction for prompt recordings: RNNoise (xiph.org), whose small network ships inside the
`pyrnnoise` wheel (`pip install 'cosyserve[denoise]'`), so nothing is downloaded at run time.

It is optional and off by default: a request or a saved voice asks for it. RNNoise works on 10 ms frames
at 48 kHz; the prompt is resampled there and back, the network's two-frame delay is taken out again,
and the level is left as it was (the prompt is loudness-normalised afterwards anyway). On a clean
recording it changes the speech level by well under 1 dB (`tests/test_prompt_cleanup.py` measures it).
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import soxr

from cosyserve.errors import InputError

RNNOISE_RATE = 48_000
FRAME = 480  # RNNoise's 10 ms frame at 48 kHz
DELAY = 2 * FRAME  # its output lags the input by two frames (measured: cross-correlation peak)
INT16_SCALE = 32767.0  # RNNoise expects int16-range floats
INSTALL_COMMAND = "pip install 'cosyserve[denoise]'"
HOW_TO_INSTALL = f"noise reduction needs the denoise extra: {INSTALL_COMMAND}"


def _rnnoise() -> Any:
    try:
        return importlib.import_module("pyrnnoise.rnnoise")
    except (ImportError, OSError) as exc:  # not installed, or its shared library can't be loaded
        raise InputError(f"{HOW_TO_INSTALL} ({exc})") from exc


def denoise_available() -> bool:
    """Whether `denoise` can run here (the UI shows its switch only then)."""
    try:
        _rnnoise()
    except InputError:
        return False
    return True


def denoise(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    """(N,) float32 in [-1, 1] at `sample_rate` -> the same length with background noise suppressed."""
    rnnoise = _rnnoise()
    samples = np.asarray(samples, dtype=np.float32)
    if samples.size == 0:
        return samples
    at48k = (
        soxr.resample(samples, sample_rate, RNNOISE_RATE, quality="HQ")
        if sample_rate != RNNOISE_RATE
        else samples
    )
    frames = -(-(len(at48k) + DELAY) // FRAME)
    padded = np.zeros(frames * FRAME, dtype=np.float32)
    padded[: len(at48k)] = at48k * INT16_SCALE
    cleaned = np.empty_like(padded)
    state = rnnoise.create()
    try:
        for index in range(frames):
            frame = np.ascontiguousarray(padded[index * FRAME : (index + 1) * FRAME])
            out, _ = _process(rnnoise, state, frame)
            cleaned[index * FRAME : (index + 1) * FRAME] = out
    finally:
        rnnoise.destroy(state)
    cleaned = cleaned[DELAY : DELAY + len(at48k)] / INT16_SCALE
    back = (
        soxr.resample(cleaned, RNNOISE_RATE, sample_rate, quality="HQ")
        if sample_rate != RNNOISE_RATE
        else cleaned
    )
    out = np.zeros(len(samples), dtype=np.float32)
    out[: min(len(out), len(back))] = back[: len(out)]
    return np.clip(out, -1.0, 1.0)


def _process(rnnoise: Any, state: Any, frame: np.ndarray) -> tuple[np.ndarray, float]:
    """One frame through RNNoise in float (the wrapper's int16 path would round twice)."""
    import ctypes

    buffer = frame.astype(np.float32).copy()
    pointer = buffer.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    speech = rnnoise.lib.rnnoise_process_frame(state, pointer, pointer)
    return buffer, float(speech)
