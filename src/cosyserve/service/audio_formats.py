"""Output audio encoding: float32 mono at the model's rate to wav/mp3/opus/flac/pcm, whole or streamed.

Every path applies the same steps in the same order: resample to the requested rate (soxr, the output
filter `frontend.resampling` chooses), multiply by `volume`, clip to [-1, 1], encode.

Formats (libsndfile >= 1.1 writes all of them; `pcm` is headerless little-endian int16, like OpenAI's):
| format | container / codec | rates | streamed as |
| --- | --- | --- | --- |
| wav  | RIFF, PCM 16-bit | any 8000..48000 | a header with unknown length (0xFFFFFFFF sizes), then samples |
| pcm  | none, int16 LE   | any 8000..48000 | samples as they come |
| flac | FLAC, 16-bit     | any 8000..48000 | frames as completed; STREAMINFO says "length/MD5 unknown" |
| mp3  | MPEG Layer III   | 8000 11025 12000 16000 22050 24000 32000 44100 48000 | constant bit rate frames |
| opus | Ogg Opus         | 8000 12000 16000 24000 48000 | Ogg pages, about one per second of audio |

Why streamed mp3 is constant bit rate: a whole mp3 file is VBR with a Xing/LAME header that libsndfile
fills in when the file is closed (exact length, gapless). A stream can't go back to fill it in, and
decoders that see no Xing header estimate the length from the first frame's bit rate: with VBR that
estimate is wrong (soundfile/mpg123 stop early), with CBR it is right.

Streamed flac / opus / mp3 are produced by libsndfile writing into `_DrainedSink`, from which new bytes
are taken after every chunk. When the encoder closes it seeks back to rewrite header fields (flac
STREAMINFO sample count and MD5, the mp3 Xing frame); bytes already sent can't change, so those rewrites
are dropped — which is what a streamed flac/mp3 looks like from any live encoder.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import soundfile

from cosyserve.errors import InputError
from cosyserve.frontend.resampling import output_resample, output_resample_stream

SAMPLE_RATE = 24000  # the model's output rate: what audio comes at unless a source rate is given

FORMATS = ("wav", "mp3", "opus", "flac", "pcm")
MIN_SAMPLE_RATE = 8000
MAX_SAMPLE_RATE = 48000

MIME_TYPES = {
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg; codecs=opus",
    "flac": "audio/flac",
    "pcm": "audio/pcm",  # raw int16 LE mono; the rate is in the X-Sample-Rate header / the request
}
EXTENSIONS = {"wav": "wav", "mp3": "mp3", "opus": "opus", "flac": "flac", "pcm": "pcm"}

# The codecs' own rate tables (libsndfile refuses anything else).
MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)

# libsndfile (format, subtype) for the formats it writes.
_SNDFILE_FORMATS = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
    "opus": ("OGG", "OPUS"),
}
STREAM_MP3_COMPRESSION = 0.6  # libsndfile's 0..1 scale; about 64 kbit/s CBR for mono 24 kHz

_INT16_MAX = 32767
_UNKNOWN_SIZE = 0xFFFFFFFF


def check_format(fmt: str) -> str:
    """The canonical (lower-case) format name; InputError if it is not one of FORMATS."""
    name = (fmt or "").strip().lower()
    if name not in FORMATS:
        raise InputError(f"unknown response format {fmt!r}; use one of {', '.join(FORMATS)}")
    return name


def check_sample_rate(fmt: str, sample_rate: int | None, source_rate: int = SAMPLE_RATE) -> int:
    """The output rate for `fmt` (None: `source_rate`); InputError if the format can't carry it."""
    fmt = check_format(fmt)
    if sample_rate is None:
        sample_rate = source_rate
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)):
        raise InputError(f"sample_rate must be a whole number of Hz, got {sample_rate!r}")
    rate = int(sample_rate)
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise InputError(
            f"sample_rate {rate} Hz is out of range; use {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz "
            f"(the model produces {source_rate} Hz)"
        )
    allowed = {"mp3": MP3_RATES, "opus": OPUS_RATES}.get(fmt)
    if allowed is not None and rate not in allowed:
        raise InputError(
            f"{fmt} can't be encoded at {rate} Hz; use one of {', '.join(map(str, allowed))} Hz, "
            "or choose wav, flac or pcm for other rates"
        )
    return rate


def mime_type(fmt: str) -> str:
    """The Content-Type for a response in `fmt`."""
    return MIME_TYPES[check_format(fmt)]


def prepare(
    audio: np.ndarray, *, source_rate: int = SAMPLE_RATE, sample_rate: int | None = None, volume: float = 1.0
) -> np.ndarray:
    """Resample, apply gain and clip: `audio` (S,) float -> (S',) float32 in [-1, 1] at `sample_rate`."""
    samples = _as_mono_float32(audio)
    rate = source_rate if sample_rate is None else int(sample_rate)
    if rate != source_rate and len(samples):
        samples = output_resample(samples, source_rate, rate)
    return _gain_and_clip(samples, volume)


def encode(
    audio: np.ndarray,
    fmt: str,
    *,
    source_rate: int = SAMPLE_RATE,
    sample_rate: int | None = None,
    volume: float = 1.0,
) -> bytes:
    """A whole file in `fmt`: `audio` (S,) float32 mono at `source_rate` -> bytes at `sample_rate`."""
    fmt = check_format(fmt)
    rate = check_sample_rate(fmt, sample_rate, source_rate)
    _check_volume(volume)
    samples = prepare(audio, source_rate=source_rate, sample_rate=rate, volume=volume)
    if fmt == "pcm":
        return _to_int16_bytes(samples)
    container, subtype = _SNDFILE_FORMATS[fmt]
    buffer = io.BytesIO()
    with soundfile.SoundFile(
        buffer, "w", samplerate=rate, channels=1, format=container, subtype=subtype
    ) as sound:
        sound.write(samples)
    return buffer.getvalue()


class StreamEncoder:
    """Encodes audio that arrives in chunks into one continuous stream of `fmt`.

    `header()` (optional), then `encode(chunk)` per chunk, then `finish()` once; the concatenation of what
    they return is the stream. Bytes an encoder has produced but not yet returned are returned by the next
    call, so skipping `header()` loses nothing. Resampling is streamed too (soxr keeps its filter state
    across chunks), so chunk boundaries leave no clicks.
    """

    def __init__(
        self, fmt: str, sample_rate: int | None = None, *, source_rate: int = SAMPLE_RATE, volume: float = 1.0
    ) -> None:
        self.format = check_format(fmt)
        self.sample_rate = check_sample_rate(self.format, sample_rate, source_rate)
        self.source_rate = source_rate
        self.volume = _check_volume(volume)
        self.media_type = MIME_TYPES[self.format]
        self._resampler = (
            output_resample_stream(source_rate, self.sample_rate) if self.sample_rate != source_rate else None
        )
        self._finished = False
        self._sink = _DrainedSink()
        self._sound: soundfile.SoundFile | None = None
        if self.format == "wav":
            self._sink.write(streaming_wav_header(self.sample_rate))
        elif self.format in _SNDFILE_FORMATS:
            container, subtype = _SNDFILE_FORMATS[self.format]
            extra = {}
            if self.format == "mp3":
                extra = {"bitrate_mode": "CONSTANT", "compression_level": STREAM_MP3_COMPRESSION}
            self._sound = soundfile.SoundFile(
                self._sink,
                "w",
                samplerate=self.sample_rate,
                channels=1,
                format=container,
                subtype=subtype,
                **extra,
            )

    def header(self) -> bytes:
        """Bytes that can be sent before any audio (the wav header; empty for pcm; whatever the codec
        wrote on opening for the others)."""
        return self._sink.drain()

    def encode(self, chunk: np.ndarray) -> bytes:
        """Encode the next chunk (S,) float32 at `source_rate`; returns the bytes now ready (may be empty)."""
        if self._finished:
            raise RuntimeError("StreamEncoder.encode called after finish()")
        samples = _as_mono_float32(chunk)
        if self._resampler is not None:
            samples = self._resampler.resample_chunk(samples, last=False)
        self._write(_gain_and_clip(samples, self.volume))
        return self._sink.drain()

    def finish(self) -> bytes:
        """Flush the resampler and the codec; returns the stream's last bytes. Safe to call twice."""
        if self._finished:
            return b""
        self._finished = True
        if self._resampler is not None:
            tail = self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
            self._write(_gain_and_clip(tail, self.volume))
        if self._sound is not None:
            self._sound.close()
        return self._sink.drain()

    def _write(self, samples: np.ndarray) -> None:
        if not len(samples):
            return
        if self._sound is not None:
            self._sound.write(samples)
        else:  # wav / pcm: plain int16 after the header
            self._sink.write(_to_int16_bytes(samples))


def streaming_wav_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    """A 44-byte RIFF/WAVE PCM header whose RIFF and data sizes say "unknown" (0xFFFFFFFF).

    Players and decoders (browsers, ffmpeg, libsndfile) then read samples until the stream ends.
    """
    block_align = channels * bits // 8
    fmt_chunk = struct.pack("<HHIIHH", 1, channels, sample_rate, sample_rate * block_align, block_align, bits)
    return (
        b"RIFF"
        + struct.pack("<I", _UNKNOWN_SIZE)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt_chunk))
        + fmt_chunk
        + b"data"
        + struct.pack("<I", _UNKNOWN_SIZE)
    )


class _DrainedSink:
    """A seekable in-memory file for libsndfile whose bytes are taken out as soon as they are written.

    Only bytes after `_sent` are kept; writes that land before it (an encoder rewriting its header on
    close) are dropped, because they have already been sent.
    """

    def __init__(self) -> None:
        self._pending = bytearray()  # bytes at offsets [_sent, _sent + len)
        self._sent = 0
        self._pos = 0
        self._size = 0

    def write(self, data: bytes) -> int:
        data = bytes(data)
        start, end = self._pos, self._pos + len(data)
        keep_from = max(start, self._sent)
        if end > keep_from:
            offset = keep_from - self._sent
            missing = offset + (end - keep_from) - len(self._pending)
            if missing > 0:
                self._pending.extend(b"\0" * missing)
            self._pending[offset : offset + end - keep_from] = data[keep_from - start :]
        self._pos = end
        self._size = max(self._size, end)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int = -1) -> bytes:
        # Encoders in write mode do not read back; returning nothing keeps libsndfile from guessing.
        return b""

    def drain(self) -> bytes:
        out = bytes(self._pending[: self._size - self._sent])
        self._sent += len(out)
        del self._pending[: len(out)]
        return out


# -- a stored file transcoded block by block ---------------------------------------------------------
# The same steps as `encode` (resample with soxr's streaming filter, gain, clip, encode) and the same
# encoders, file to file, so memory does not depend on the audio's length (a dub's track lasts hours).
# libsndfile writes a file (seekable), so it finishes it as a whole file (FLAC STREAMINFO, the MP3's
# Xing/LAME header).

TRANSCODE_BLOCK = 1 << 16  # frames read, converted and written at once
IN_MEMORY_LIMIT_BYTES = 64 << 20  # a stored WAV up to this size may still be transcoded whole in memory


def transcode_file(
    source: Path, target: Path, fmt: str, *, sample_rate: int | None = None, volume: float = 1.0
) -> None:
    """Write the audio of `source` (any file libsndfile reads; mono, or mixed down) to `target` in `fmt`."""
    fmt = check_format(fmt)
    _check_volume(volume)
    with soundfile.SoundFile(source) as reader:
        rate = check_sample_rate(fmt, sample_rate, reader.samplerate)
        resampler = output_resample_stream(reader.samplerate, rate) if rate != reader.samplerate else None
        with _TranscodeTarget(target, fmt, rate) as write:
            for block in reader.blocks(TRANSCODE_BLOCK, dtype="float32", always_2d=True):
                samples = block.mean(axis=1, dtype=np.float32) if block.shape[1] > 1 else block[:, 0]
                if resampler is not None:
                    samples = resampler.resample_chunk(samples, last=False)
                write(_gain_and_clip(samples, volume))
            if resampler is not None:
                write(_gain_and_clip(resampler.resample_chunk(np.zeros(0, np.float32), last=True), volume))


class _TranscodeTarget:
    """Where transcoded blocks go: a libsndfile file, or raw int16 for `pcm`."""

    def __init__(self, path: Path, fmt: str, rate: int) -> None:
        self.path, self.fmt, self.rate = Path(path), fmt, rate

    def __enter__(self) -> _TranscodeTarget:
        if self.fmt == "pcm":
            self._raw = self.path.open("wb")
            self._sound = None
        else:
            container, subtype = _SNDFILE_FORMATS[self.fmt]
            self._sound = soundfile.SoundFile(
                self.path, "w", samplerate=self.rate, channels=1, format=container, subtype=subtype
            )
        return self

    def __call__(self, samples: np.ndarray) -> None:
        if not len(samples):
            return
        if self._sound is not None:
            self._sound.write(samples)
        else:
            self._raw.write(_to_int16_bytes(samples))

    def __exit__(self, *exc: object) -> None:
        if self._sound is not None:
            self._sound.close()
        else:
            self._raw.close()


def _as_mono_float32(audio: np.ndarray) -> np.ndarray:
    samples = np.asarray(audio, dtype=np.float32)
    if samples.ndim != 1:
        raise InputError(f"audio to encode must be mono (S,), got shape {samples.shape}")
    return samples


def _check_volume(volume: float) -> float:
    if not (isinstance(volume, (int, float)) and np.isfinite(volume) and 0.0 <= volume <= 10.0):
        raise InputError(f"volume must be a gain between 0 and 10 (1.0 = unchanged), got {volume!r}")
    return float(volume)


def _gain_and_clip(samples: np.ndarray, volume: float) -> np.ndarray:
    if volume != 1.0:
        samples = samples * np.float32(volume)
    return np.clip(samples, -1.0, 1.0).astype(np.float32, copy=False)


def _to_int16_bytes(samples: np.ndarray) -> bytes:
    return np.round(samples * _INT16_MAX).astype("<i2").tobytes()
