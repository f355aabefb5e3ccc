"""Output encoding: every format decodes back at the right rate and length, whole and streamed."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import soundfile

from cosyserve.errors import InputError
from cosyserve.service.audio_formats import (
    FORMATS,
    MIME_TYPES,
    StreamEncoder,
    check_sample_rate,
    encode,
    mime_type,
    streaming_wav_header,
)

RATE = 24000


def tone(seconds: float = 1.0, amplitude: float = 0.3, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def decode(data: bytes) -> tuple[np.ndarray, int]:
    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32")
    return samples, rate


def stream(fmt: str, audio: np.ndarray, chunk: int = 2400, **kwargs: object) -> bytes:
    encoder = StreamEncoder(fmt, **kwargs)
    parts = [encoder.header()]
    parts += [encoder.encode(audio[i : i + chunk]) for i in range(0, len(audio), chunk)]
    parts.append(encoder.finish())
    assert encoder.finish() == b""
    return b"".join(parts)


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "flac"])
@pytest.mark.parametrize("rate", [None, 16000, 48000])
def test_every_format_decodes_back_with_rate_and_length(fmt: str, rate: int | None) -> None:
    audio = tone(1.0)
    data = encode(audio, fmt, sample_rate=rate)
    samples, got_rate = decode(data)
    expected_rate = rate or RATE
    assert got_rate == expected_rate
    assert abs(len(samples) - expected_rate) <= expected_rate * 0.002  # 1 s of audio
    if fmt in ("wav", "flac"):  # lossless apart from 16-bit rounding (and the resampler)
        reference = tone(1.0, rate=expected_rate)
        middle = slice(expected_rate // 10, -expected_rate // 10)
        assert np.abs(samples[middle] - reference[middle]).max() < (1e-4 if rate is None else 2e-3)


def test_pcm_is_raw_int16_little_endian() -> None:
    audio = tone(0.5)
    data = encode(audio, "pcm")
    assert len(data) == 2 * len(audio)
    samples = np.frombuffer(data, dtype="<i2")
    np.testing.assert_array_equal(samples, np.round(audio * 32767).astype(np.int16))
    assert len(encode(audio, "pcm", sample_rate=8000)) == 2 * 4000


def test_volume_and_clipping() -> None:
    audio = tone(0.2, amplitude=0.5)
    loud = np.frombuffer(encode(audio, "pcm", volume=4.0), dtype="<i2")
    assert loud.max() == 32767 and loud.min() == -32767  # clipped to [-1, 1]
    half = np.frombuffer(encode(audio, "pcm", volume=0.5), dtype="<i2")
    assert abs(np.abs(half).max() - round(0.25 * 32767)) <= 1
    with pytest.raises(InputError, match="volume"):
        encode(audio, "wav", volume=-1.0)


def test_unknown_format_and_bad_rates_are_input_errors() -> None:
    audio = tone(0.1)
    with pytest.raises(InputError, match="unknown response format 'aac'"):
        encode(audio, "aac")
    with pytest.raises(InputError, match="out of range"):
        encode(audio, "wav", sample_rate=96000)
    with pytest.raises(InputError, match="opus can't be encoded at 44100"):
        check_sample_rate("opus", 44100)
    with pytest.raises(InputError, match="mp3 can't be encoded at 10000"):
        check_sample_rate("mp3", 10000)
    with pytest.raises(InputError, match="whole number"):
        check_sample_rate("wav", 22050.5)  # type: ignore[arg-type]
    assert check_sample_rate("WAV", 22050) == 22050
    assert check_sample_rate("flac", None) == RATE


def test_mime_types() -> None:
    assert set(MIME_TYPES) == set(FORMATS)
    assert mime_type("mp3") == "audio/mpeg"
    assert mime_type("Opus").startswith("audio/ogg")


def test_streaming_wav_header_declares_unknown_length() -> None:
    header = streaming_wav_header(RATE)
    assert len(header) == 44 and header[:4] == b"RIFF" and header[8:12] == b"WAVE"
    assert struct.unpack("<I", header[4:8])[0] == 0xFFFFFFFF
    assert struct.unpack("<I", header[40:44])[0] == 0xFFFFFFFF
    assert struct.unpack("<I", header[24:28])[0] == RATE


def test_streamed_wav_and_pcm_equal_the_whole_encoding() -> None:
    audio = tone(1.0)
    streamed = stream("wav", audio)
    assert streamed[:44] == streaming_wav_header(RATE)
    assert streamed[44:] == encode(audio, "pcm")
    samples, rate = decode(streamed)  # decoders read to the end when the size is unknown
    assert rate == RATE and len(samples) == len(audio)
    assert stream("pcm", audio) == encode(audio, "pcm")


def test_streamed_resampling_matches_length_and_has_no_chunk_seams() -> None:
    audio = tone(1.0)
    streamed = stream("pcm", audio, chunk=1000, sample_rate=16000)
    samples = np.frombuffer(streamed, dtype="<i2").astype(np.float32) / 32767
    assert abs(len(samples) - 16000) <= 2
    reference = tone(1.0, rate=16000)
    assert np.abs(samples[1600:-1600] - reference[1600:-1600]).max() < 2e-3


def test_chunks_arrive_while_streaming() -> None:
    audio = tone(2.0)
    encoder = StreamEncoder("mp3")
    sizes = [len(encoder.encode(audio[i : i + 4800])) for i in range(0, len(audio), 4800)]
    encoder.finish()
    assert sum(size > 0 for size in sizes) >= len(sizes) - 1  # mp3 frames come out chunk by chunk


def test_streamed_mp3_decodes_to_full_length() -> None:
    audio = tone(2.0)
    samples, rate = decode(stream("mp3", audio))
    assert rate == RATE
    # CBR: decoders that estimate the length from the first frame get all of it (+ codec delay/padding).
    assert len(audio) <= len(samples) <= len(audio) + 3 * 1152


def test_streamed_opus_decodes() -> None:
    audio = tone(2.0)
    samples, rate = decode(stream("opus", audio))
    assert rate == RATE and len(samples) == len(audio)


def test_streamed_flac_is_the_file_without_the_closing_header_rewrite() -> None:
    audio = tone(1.0)
    streamed = stream("flac", audio)
    whole = encode(audio, "flac")
    assert len(streamed) == len(whole)
    # Only STREAMINFO (bytes 8..42: frame sizes, sample count, MD5) can differ: "unknown" in a stream.
    differing = [i for i in range(len(whole)) if streamed[i] != whole[i]]
    assert differing and min(differing) >= 8 and max(differing) < 42
    samples, _ = decode(whole)
    assert len(samples) == len(audio)


def test_stream_encoder_rejects_use_after_finish() -> None:
    encoder = StreamEncoder("wav")
    encoder.finish()
    with pytest.raises(RuntimeError):
        encoder.encode(tone(0.1))
