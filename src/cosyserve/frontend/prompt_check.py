"""Is a prompt recording usable for voice cloning? Reject what cannot work, warn about what will hurt.

Rejections raise InputError saying what was wrong and what to do. Accepted prompts get a `PromptReport`
with measurements and warnings that the API and UI show to the user.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from cosyserve.errors import InputError
from cosyserve.frontend import denoise as denoise_module
from cosyserve.frontend.audio import (
    SILENCE_BELOW_PEAK_DB,
    SILENCE_FLOOR_DBFS,
    DecodedAudio,
    decode_audio,
    find_speech_span,
    frame_levels_db,
    peak_db,
    remove_dc_offset,
    speech_rms_db,
    trim_silence,
)

MIN_SAMPLE_RATE = 8000
MAX_SAMPLE_RATE = 192000
LOW_SAMPLE_RATE = 16000  # below this the cloned voice sounds muffled
MIN_PROMPT_S = 3.0  # after trimming silence down to short margins
MAX_PROMPT_S = 30.0  # the speech tokenizer accepts at most 30 s
SILENT_BELOW_DBFS = -60.0  # loudest 20 ms frame quieter than this: nothing was recorded
QUIET_BELOW_DBFS = -40.0  # speech RMS quieter than this: noise gets amplified by normalisation
CLIP_LEVEL = 0.999  # a sample at or above this magnitude sits at full scale
CLIP_REJECT_RATIO = 0.01
CLIP_WARN_RATIO = 0.001
MIN_TRAILING_SILENCE_S = 0.1
NOISY_BELOW_SNR_DB = 20.0  # estimated speech-to-noise ratio under this: the noise gets cloned too
SNR_CAP_DB = 60.0  # digital silence has no noise floor to measure: report at most this
NOISE_FRAMES = 0.1  # the quietest tenth of the 20 ms frames stands for the background

RECORDING_HINT = "3 to 30 seconds of one person speaking clearly, ideally 5 to 15 s"


@dataclass(frozen=True)
class PromptReport:
    """Measurements of an accepted prompt (levels are of the file as uploaded, before normalisation)."""

    duration_s: float  # what the model gets: speech plus short silence margins
    speech_s: float  # from the first to the last non-silent frame
    original_duration_s: float
    peak_dbfs: float
    rms_dbfs: float  # over the frames that hold sound
    clipping_ratio: float  # fraction of samples at full scale
    leading_silence_s: float  # in the file, before trimming
    trailing_silence_s: float
    sample_rate: int
    channels: int
    format: str
    warnings: tuple[str, ...]  # human-readable advice; empty when the prompt looks good
    snr_db: float = SNR_CAP_DB  # estimated speech-to-noise ratio (see `estimate_snr_db`)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["warnings"] = list(self.warnings)
        return data


def load_prompt(source: str | Path | bytes | BinaryIO) -> tuple[DecodedAudio, PromptReport]:
    """Decode and check a prompt (without a DC offset it may have: see `remove_dc_offset`); raise
    InputError if it cannot be used."""
    decoded = decode_audio(source)
    report = check_prompt(decoded)
    return dataclasses.replace(decoded, samples=remove_dc_offset(decoded.samples)), report


def check_prompt(audio: DecodedAudio) -> PromptReport:
    """Validate a decoded prompt and measure it; raise InputError naming the problem and the fix."""
    sr, samples = audio.sample_rate, audio.samples
    if not MIN_SAMPLE_RATE <= sr <= MAX_SAMPLE_RATE:
        raise InputError(
            f"the prompt's sample rate is {sr} Hz, outside the supported "
            f"{MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz; export it at 16, 24, 44.1 or 48 kHz"
        )
    clipping = float(np.mean(np.abs(samples) >= CLIP_LEVEL))  # of the file as it came
    samples = remove_dc_offset(samples)  # an offset is no sound: it made silence count as speech
    loudest = float(frame_levels_db(samples, sr).max())
    if loudest < SILENT_BELOW_DBFS:
        raise InputError(
            f"the prompt is silent (its loudest moment is {loudest:.0f} dBFS); check the microphone "
            f"and record {RECORDING_HINT}"
        )
    if clipping > CLIP_REJECT_RATIO:
        raise InputError(
            f"the prompt is badly clipped ({clipping:.1%} of samples at full scale), which would make the "
            "cloned voice distorted; record it again with the input gain turned down"
        )
    span = find_speech_span(samples, sr)
    speech_s = (span.end - span.start) / sr
    if speech_s > MAX_PROMPT_S:
        raise InputError(
            f"the prompt holds {speech_s:.1f} s of sound after trimming silence at the start and end; "
            f"at most {MAX_PROMPT_S:.0f} s is supported: cut it to {RECORDING_HINT}"
        )
    duration_s = len(trim_silence(samples, sr, max_duration_s=MAX_PROMPT_S)) / sr
    if duration_s < MIN_PROMPT_S:
        _refuse_if_too_quiet(samples, sr)
        raise InputError(
            f"the prompt is only {duration_s:.1f} s long after trimming silence at the start and end; "
            f"at least {MIN_PROMPT_S:.0f} s is needed: record {RECORDING_HINT}"
        )
    rms = speech_rms_db(samples, sr)
    trailing_s = (span.total - span.end) / sr
    snr = estimate_snr_db(samples, sr)
    warnings = _warnings(sr, rms, clipping, trailing_s)
    if snr < NOISY_BELOW_SNR_DB:
        warnings.append(_noisy_warning(snr))
    return PromptReport(
        duration_s=round(duration_s, 3),
        speech_s=round(speech_s, 3),
        original_duration_s=round(audio.duration_s, 3),
        peak_dbfs=round(peak_db(samples), 2),
        rms_dbfs=round(rms, 2),
        clipping_ratio=clipping,
        leading_silence_s=round(span.start / sr, 3),
        trailing_silence_s=round(trailing_s, 3),
        sample_rate=sr,
        channels=audio.channels,
        format=audio.format,
        warnings=tuple(warnings),
        snr_db=round(snr, 1),
    )


def estimate_snr_db(samples: np.ndarray, sample_rate: int) -> float:
    """Speech level over the background, in dB: the sounding frames' mean power against the quietest
    tenth of all frames (pauses between words), capped at `SNR_CAP_DB` for digitally clean silence."""
    levels = frame_levels_db(samples, sample_rate)
    if levels.size < 10:
        return SNR_CAP_DB
    speech = speech_rms_db(samples, sample_rate)
    quiet = np.sort(levels)[: max(3, int(levels.size * NOISE_FRAMES))]
    noise = float(10.0 * np.log10(np.mean(10.0 ** (quiet / 10.0))))
    return float(min(SNR_CAP_DB, max(0.0, speech - noise)))


def _refuse_if_too_quiet(samples: np.ndarray, sample_rate: int) -> None:
    """A short prompt that is long when judged only against its own loudest moment: it is the absolute
    silence floor that cut it, so the recording is too quiet, not too short; say so."""
    levels = frame_levels_db(samples, sample_rate)
    sounding = np.flatnonzero(levels > levels.max() - SILENCE_BELOW_PEAK_DB)
    frame_s = len(samples) / sample_rate / max(1, levels.size)
    relative_s = (sounding[-1] - sounding[0] + 1) * frame_s if sounding.size else 0.0
    if relative_s >= MIN_PROMPT_S:
        raise InputError(
            f"the prompt is too quiet (peak {peak_db(samples):.0f} dBFS, its speech mostly below "
            f"{SILENCE_FLOOR_DBFS:.0f} dBFS), so most of it counts as silence; raise its level (normalise "
            "it to a peak of about -3 dBFS) or record closer to the microphone"
        )


def _noisy_warning(snr: float) -> str:
    """The low-SNR advice; it points to noise reduction only where this server has it (the denoise extra),
    and otherwise says how to add it."""
    said = (
        f"noisy recording (speech about {snr:.0f} dB above the background): the noise is cloned "
        "with the voice"
    )
    if denoise_module.denoise_available():
        return f"{said}; turn on noise reduction or record somewhere quieter"
    return (
        f"{said}; record somewhere quieter (noise reduction is not installed on this server: "
        f"{denoise_module.INSTALL_COMMAND})"
    )


def _warnings(sample_rate: int, rms_dbfs: float, clipping: float, trailing_s: float) -> list[str]:
    warnings = []
    if sample_rate < LOW_SAMPLE_RATE:
        warnings.append(
            f"low sample rate ({sample_rate} Hz): the cloned voice will sound muffled; "
            "use 16 kHz or more if you can"
        )
    if rms_dbfs < QUIET_BELOW_DBFS:
        warnings.append(
            f"very quiet recording (speech at {rms_dbfs:.0f} dBFS): it is amplified, and its background "
            "noise with it; record closer to the microphone"
        )
    if clipping > CLIP_WARN_RATIO:
        warnings.append(
            f"some clipping ({clipping:.2%} of samples at full scale): the cloned voice may sound harsh; "
            "record with the input gain lower"
        )
    if trailing_s < MIN_TRAILING_SILENCE_S:
        warnings.append(
            "no trailing silence: the model may speak the end of the prompt; leave about half a second of "
            "silence after the last word"
        )
    return warnings
