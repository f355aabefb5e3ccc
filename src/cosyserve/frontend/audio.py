"""Prompt audio: decoding, mono mix-down, resampling, silence detection and trimming, loudness normalisation.

Everything works on float32 numpy arrays in [-1, 1] at the file's own rate; `resampling` takes it from there.

Choices that differ from the official front end (which only loads and resamples) and why:
- Leading/trailing silence is trimmed down to short margins (`LEAD_MARGIN_S`, `TRAIL_MARGIN_S`): long
  silences waste prompt tokens and make the model pause, while a short trailing pause helps the model
  start the new text cleanly instead of continuing the prompt's last word.
- Loudness is normalised (`normalise_loudness`): the flow copies the prompt mel's level into its output,
  so a very quiet or very hot prompt gives a quiet or hot result. Speech RMS is brought to -20 dBFS
  (measured over speech frames only, so pauses do not count), with the peak kept at or below -1 dBFS and
  the gain capped at +20 dB so that noise in near-silent files is not blown up.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import soundfile

from cosyserve.errors import InputError

SUPPORTED_FORMATS_HINT = "use WAV, FLAC, OGG (Vorbis/Opus) or MP3"

FRAME_S = 0.02  # analysis frame for level and silence detection
SILENCE_BELOW_PEAK_DB = 40.0  # a frame this far below the loudest frame counts as silence
SILENCE_FLOOR_DBFS = -60.0  # ... and so does any frame quieter than this
LEAD_MARGIN_S = 0.2  # silence kept before the first speech frame
TRAIL_MARGIN_S = 0.3  # silence kept after the last speech frame

TARGET_SPEECH_RMS_DBFS = -20.0
PEAK_CEILING_DBFS = -1.0
MAX_GAIN_DB = 20.0
# Admission: what a prompt file may be at most. A prompt holds 3-30 s of speech; a file may carry
# silence around it, and is trimmed later. Checked from the header before decoding, and while decoding.
MAX_FILE_S = 60.0
MAX_SAMPLE_RATE = 192_000
MAX_CHANNELS = 8
DECODE_BLOCK_FRAMES = 1 << 16  # frames decoded at a time (2 MB for 8 channels of float32)
# What libsndfile reports as the length of a file whose header does not say (a FLAC from a streaming
# encoder writes 0 total samples): counted while decoding instead, within the same limits.
UNKNOWN_LENGTH = (1 << 63) - 1


@dataclass(frozen=True)
class DecodedAudio:
    """A decoded file: `samples` (N,) float32 mono (channels averaged) at `sample_rate`."""

    samples: np.ndarray
    sample_rate: int
    channels: int  # in the file, before the mix-down
    format: str  # libsndfile's name, e.g. "WAV", "FLAC", "MP3"

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate


def decode_audio(source: str | Path | bytes | BinaryIO) -> DecodedAudio:
    """Decode a file path, raw bytes or a binary file object; raise InputError if it is not usable audio.

    Admission comes before decoding: the header's sample rate, channels and length are checked first,
    then the frames are decoded in blocks and mixed down to mono as they come, so memory never exceeds
    MAX_FILE_S of mono float32 even when a compressed file's header lies about its length, or gives none.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) == 0:
            raise InputError(f"the audio upload is empty (0 bytes); {SUPPORTED_FORMATS_HINT}")
        source = io.BytesIO(bytes(source))
        name = "the uploaded audio"
    elif isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise InputError(f"audio file {path} does not exist; check the path")
        if path.stat().st_size == 0:
            raise InputError(f"audio file {path} is empty (0 bytes); {SUPPORTED_FORMATS_HINT}")
        name = f"audio file {path}"
    else:
        name = "the audio stream"
    try:
        with soundfile.SoundFile(source) as sound:
            sample_rate, channels, fmt = sound.samplerate, sound.channels, sound.format
            length_known = 0 < sound.frames < UNKNOWN_LENGTH
            _admit(name, sample_rate, channels, sound.frames if length_known else None)
            if not length_known:
                _read_without_seeking(sound)
            samples = _read_mono(sound, name, int(MAX_FILE_S * sample_rate))
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise InputError(
            f"{name} could not be decoded ({_without_reprs(exc)}); {SUPPORTED_FORMATS_HINT}"
        ) from exc
    if samples.shape[0] == 0:
        raise InputError(f"{name} contains no samples; record or upload a prompt of 3 to 30 seconds")
    if not np.isfinite(samples).all():
        raise InputError(f"{name} contains NaN or infinite samples; export it again as 16-bit WAV")
    return DecodedAudio(samples, int(sample_rate), int(channels), str(fmt))


def _admit(name: str, sample_rate: int, channels: int, frames: int | None) -> None:
    """Refuse from the header what cannot be a prompt, before anything is decoded (`frames` None: the
    header does not give the length; `_read_mono` counts it)."""
    if not 0 < sample_rate <= MAX_SAMPLE_RATE:
        raise InputError(
            f"{name}: its sample rate is {sample_rate} Hz, above the {MAX_SAMPLE_RATE} Hz accepted; "
            "export it at 16, 24, 44.1 or 48 kHz"
        )
    if not 0 < channels <= MAX_CHANNELS:
        raise InputError(
            f"{name} has {channels} channels; at most {MAX_CHANNELS} are accepted: export it as mono"
        )
    if frames is not None and frames > MAX_FILE_S * sample_rate:
        raise InputError(
            f"{name} is {_duration(frames / sample_rate)} long; a prompt file may be at most "
            f"{MAX_FILE_S:.0f} s: cut out one or two clear sentences (3 to 30 seconds)"
        )


def _read_without_seeking(sound: soundfile.SoundFile) -> None:
    """Read a file of unknown length as from a pipe. soundfile seeks to where each read ended, and libFLAC
    cannot seek to the end of a stream whose length it was not told, so the read that reaches the end
    would fail; without seeks each read returns what it decoded, and an empty one marks the end."""
    info = getattr(sound, "_info", None)  # soundfile keeps libsndfile's SF_INFO there
    if info is not None and hasattr(info, "seekable"):
        info.seekable = 0


def _read_mono(sound: soundfile.SoundFile, name: str, max_frames: int) -> np.ndarray:
    """Decode block by block into mono float32 (N,), refusing past `max_frames` (a lying header)."""
    blocks, total = [], 0
    while True:
        block = sound.read(DECODE_BLOCK_FRAMES, dtype="float32", always_2d=True)  # (n, C)
        if block.shape[0] == 0:
            break
        total += block.shape[0]
        if total > max_frames:
            raise InputError(
                f"{name} decodes to more than {_duration(max_frames / sound.samplerate)} of audio (its "
                f"header said less); a prompt file may be at most {MAX_FILE_S:.0f} s: cut out one or two "
                "sentences"
            )
        blocks.append(to_mono(block))
    return np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.float32)


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} minutes" if seconds >= 120 else f"{seconds:.0f} s"


def _without_reprs(exc: BaseException) -> str:
    """The decoder's message without Python object reprs (`<_io.BytesIO object at 0x…>`)."""
    text = re.sub(r"<[^<>]* at 0x[0-9a-fA-F]+>", "the upload", str(exc))
    return " ".join(text.split()) or type(exc).__name__


def to_mono(data: np.ndarray) -> np.ndarray:
    """(N,) or (N, C) -> (N,) float32, channels averaged (as the official loader does)."""
    data = np.asarray(data, dtype=np.float32)
    if data.ndim == 1:
        return data
    return np.ascontiguousarray(data.mean(axis=1, dtype=np.float32))


# A constant offset larger than this (about -54 dBFS) is a recording fault (a cheap interface or a
# mis-biased converter), not speech: the mean of a real recording's speech is some 1e-5 of full scale.
DC_OFFSET_MIN = 0.002


def remove_dc_offset(samples: np.ndarray) -> np.ndarray:
    """(N,) without its constant offset, where it has one of more than `DC_OFFSET_MIN` (an offset made
    silence count as sound: nothing was trimmed, its "noise" was the offset); otherwise unchanged."""
    if samples.size == 0:
        return samples
    offset = float(np.mean(samples, dtype=np.float64))
    if abs(offset) <= DC_OFFSET_MIN:
        return samples
    return (samples - np.float32(offset)).astype(np.float32, copy=False)


def frame_levels_db(samples: np.ndarray, sample_rate: int, frame_s: float = FRAME_S) -> np.ndarray:
    """RMS level of non-overlapping frames in dBFS: (N,) -> (ceil(N / frame),), the last zero-padded."""
    frame = max(1, round(frame_s * sample_rate))
    count = -(-len(samples) // frame)
    padded = np.zeros(count * frame, dtype=np.float64)
    padded[: len(samples)] = samples
    power = np.square(padded).reshape(count, frame).mean(axis=1)
    return 10.0 * np.log10(np.maximum(power, 1e-12))


def speech_frame_mask(levels_db: np.ndarray) -> np.ndarray:
    """Which frames hold sound: within `SILENCE_BELOW_PEAK_DB` of the loudest and above the absolute floor."""
    if levels_db.size == 0:
        return np.zeros(0, dtype=bool)
    return (levels_db > levels_db.max() - SILENCE_BELOW_PEAK_DB) & (levels_db > SILENCE_FLOOR_DBFS)


@dataclass(frozen=True)
class SpeechSpan:
    """Where sound starts and ends, in samples: [start, end). Empty (start == end == 0) for silence."""

    start: int
    end: int
    total: int  # samples in the whole signal

    @property
    def is_empty(self) -> bool:
        return self.end <= self.start


def find_speech_span(samples: np.ndarray, sample_rate: int) -> SpeechSpan:
    """First and last non-silent frame of `samples` (N,), to frame resolution."""
    frame = max(1, round(FRAME_S * sample_rate))
    active = np.flatnonzero(speech_frame_mask(frame_levels_db(samples, sample_rate)))
    if active.size == 0:
        return SpeechSpan(0, 0, len(samples))
    return SpeechSpan(int(active[0]) * frame, min(len(samples), (int(active[-1]) + 1) * frame), len(samples))


def trim_silence(
    samples: np.ndarray,
    sample_rate: int,
    lead_margin_s: float = LEAD_MARGIN_S,
    trail_margin_s: float = TRAIL_MARGIN_S,
    max_duration_s: float | None = None,
) -> np.ndarray:
    """Cut leading/trailing silence down to the given margins: (N,) -> (M,), M <= N.

    With `max_duration_s`, both margins shrink proportionally so the result fits; the speech itself
    is never cut. Silence-only input is returned unchanged.
    """
    span = find_speech_span(samples, sample_rate)
    if span.is_empty:
        return samples
    lead = min(span.start, round(lead_margin_s * sample_rate))
    trail = min(span.total - span.end, round(trail_margin_s * sample_rate))
    if max_duration_s is not None:
        room = round(max_duration_s * sample_rate) - (span.end - span.start)
        if lead + trail > room > 0:
            scale = room / (lead + trail)
            lead, trail = int(lead * scale), int(trail * scale)
        elif room <= 0:
            lead = trail = 0
    return samples[span.start - lead : span.end + trail]


def speech_rms_db(samples: np.ndarray, sample_rate: int) -> float:
    """RMS over the frames that hold sound, in dBFS (-120 for silence)."""
    levels = frame_levels_db(samples, sample_rate)
    mask = speech_frame_mask(levels)
    if not mask.any():
        return -120.0
    return float(10.0 * np.log10(np.mean(10.0 ** (levels[mask] / 10.0))))


def peak_db(samples: np.ndarray) -> float:
    """Peak level of (N,) in dBFS (-120 for an empty or all-zero signal)."""
    peak = float(np.max(np.abs(samples))) if len(samples) else 0.0
    return float(20.0 * np.log10(max(peak, 1e-6)))


def normalise_loudness(
    samples: np.ndarray,
    sample_rate: int,
    target_rms_dbfs: float = TARGET_SPEECH_RMS_DBFS,
    peak_ceiling_dbfs: float = PEAK_CEILING_DBFS,
    max_gain_db: float = MAX_GAIN_DB,
) -> np.ndarray:
    """Scale (N,) so speech RMS reaches `target_rms_dbfs`, unless that pushes the peak over the ceiling
    or needs more than `max_gain_db` of gain. Silence is returned unchanged."""
    rms = speech_rms_db(samples, sample_rate)
    if rms <= -120.0:
        return samples
    gain_db = min(target_rms_dbfs - rms, peak_ceiling_dbfs - peak_db(samples), max_gain_db)
    return (samples * np.float32(10.0 ** (gain_db / 20.0))).astype(np.float32)
