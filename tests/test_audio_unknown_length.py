"""A FLAC whose STREAMINFO gives no total sample count (streaming encoders write 0) decodes whole, its length
counted while decoding and still bounded by the admission limits."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile
from tests.test_audio import speech_like

from cosyserve.errors import InputError
from cosyserve.frontend.audio import MAX_FILE_S, UNKNOWN_LENGTH, decode_audio
from cosyserve.frontend.prompt_check import load_prompt

STREAMINFO_AT = 8  # "fLaC", then the 4-byte header of the first metadata block, which is STREAMINFO


def flac_without_length(samples: np.ndarray, sample_rate: int) -> bytes:
    """A real FLAC of `samples` (N,) or (N, C), then its 36-bit total-samples field set to 0, as an encoder
    that did not know the length when it wrote the header leaves it."""
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, sample_rate, format="FLAC", subtype="PCM_16")
    data = bytearray(buffer.getvalue())
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0, "the first metadata block must be STREAMINFO"
    info = STREAMINFO_AT
    total = ((data[info + 13] & 0x0F) << 32) | int.from_bytes(data[info + 14 : info + 18], "big")
    assert total == len(samples)  # the field is where the format says
    data[info + 13] &= 0xF0  # the high 4 bits of that byte are the bits per sample
    data[info + 14 : info + 18] = bytes(4)
    return bytes(data)


def test_the_built_file_really_has_no_length() -> None:
    with soundfile.SoundFile(io.BytesIO(flac_without_length(np.zeros(8000, np.float32), 8000))) as sound:
        assert sound.frames == UNKNOWN_LENGTH


def test_decodes_whole_and_equal_to_the_same_file_with_its_length(tmp_path: Path) -> None:
    left, right = speech_like(6.0, 44100, seed=1), speech_like(6.0, 44100, seed=2)
    stereo = np.stack([left, right], axis=1)
    intact = io.BytesIO()
    soundfile.write(intact, stereo, 44100, format="FLAC", subtype="PCM_16")
    expected = decode_audio(intact.getvalue())
    streamed = flac_without_length(stereo, 44100)
    path = tmp_path / "streamed.flac"
    path.write_bytes(streamed)
    for source in (streamed, path, io.BytesIO(streamed)):
        decoded = decode_audio(source)
        assert (decoded.sample_rate, decoded.channels, decoded.format) == (44100, 2, "FLAC")
        np.testing.assert_array_equal(decoded.samples, expected.samples)
    audio, report = load_prompt(streamed)  # a usable prompt, measured as long as it is
    assert audio.sample_rate == 44100
    assert report.original_duration_s == pytest.approx(len(left) / 44100, abs=0.01)


def test_still_refused_past_the_limit_while_decoding() -> None:
    rate = 8000
    too_long = np.zeros(int((MAX_FILE_S + 1) * rate), np.float32)
    with pytest.raises(InputError, match=f"more than {MAX_FILE_S:.0f} s of audio") as refused:
        decode_audio(flac_without_length(too_long, rate))
    assert "minutes" not in str(refused.value)  # no length made up from the missing header
