"""The implicit label in a WAV file: a top-level RIFF chunk named `AIGC` before the `data` chunk.

GB 45438-2025 names the metadata field `AIGC`; a RIFF chunk id is exactly four characters, so the field
is the chunk itself and its body is the label's JSON (UTF-8, padded to an even length as RIFF requires).
Readers that do not know the chunk skip it (libsndfile, ffmpeg, browsers). It goes before `data` so a
streamed WAV, whose data chunk runs to the end of the stream, can carry it in its header too.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

from cosyserve.service.labels.errors import LabelFormatError
from cosyserve.service.labels.implicit import bound_digest

FIELD = b"AIGC"
_UNKNOWN_SIZE = 0xFFFFFFFF
_HEAD_BYTES = 1 << 16  # the chunks before `data` are small (fmt, LIST): they are read whole
_BLOCK_BYTES = 1 << 20


def _chunks(data: bytes) -> Iterator[tuple[bytes, int, int]]:
    """(chunk id, offset of its header, body size clamped to the bytes present), in file order."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise LabelFormatError("not a RIFF/WAVE file")
    pos = 12
    while pos + 8 <= len(data):
        chunk_id = data[pos : pos + 4]
        size = struct.unpack_from("<I", data, pos + 4)[0]
        body = min(size, len(data) - pos - 8)
        yield chunk_id, pos, body
        if chunk_id == b"data" and size == _UNKNOWN_SIZE:  # a streamed WAV: samples to the end
            return
        pos += 8 + size + (size & 1)


def read(data: bytes) -> str | None:
    """The `AIGC` chunk's text, or None when the file has none."""
    for chunk_id, pos, size in _chunks(data):
        if chunk_id == FIELD:
            return data[pos + 8 : pos + 8 + size].rstrip(b"\0").decode("utf-8", "replace")
    return None


def format_fields(data: bytes) -> bytes:
    """The `fmt ` chunk's body (encoding, channels, sample rate, bits): how the samples play."""
    for chunk_id, pos, size in _chunks(data):
        if chunk_id == b"fmt ":
            return data[pos + 8 : pos + 8 + size]
        if chunk_id == b"data":
            break
    raise LabelFormatError("the WAV file has no fmt chunk before its data")


def payload(data: bytes) -> bytes:
    """The samples: the `data` chunk's body (what the label's hash covers)."""
    for chunk_id, pos, size in _chunks(data):
        if chunk_id == b"data":
            return data[pos + 8 : pos + 8 + size]
    raise LabelFormatError("the WAV file has no data chunk")


def strip(data: bytes) -> bytes:
    """The file without its `AIGC` chunk(s)."""
    return _rebuild(data, None)


def embed(data: bytes, text: str) -> bytes:
    """The file (or a streamed WAV's header) with one `AIGC` chunk holding `text`, just before `data`."""
    return _rebuild(data, text)


def _rebuild(data: bytes, text: str | None) -> bytes:
    out = bytearray(data[:12])
    data_at = None
    for chunk_id, pos, size in _chunks(data):
        if chunk_id == b"data":
            data_at = pos
            break
        if chunk_id != FIELD:
            out += data[pos : pos + 8 + size + (size & 1)]
    if data_at is None:
        raise LabelFormatError("the WAV file has no data chunk to label")
    if text is not None:
        body = text.encode("utf-8")
        out += FIELD + struct.pack("<I", len(body)) + body + (b"\0" if len(body) & 1 else b"")
    out += data[data_at:]
    if struct.unpack_from("<I", data, 4)[0] != _UNKNOWN_SIZE:
        struct.pack_into("<I", out, 4, len(out) - 8)
    return bytes(out)


def label_file(path: Path, label_for: Callable[[str], str]) -> None:
    """Give the WAV file at `path` one `AIGC` chunk, `label_for(sha256 of its samples)`, in place: the
    samples are hashed and copied in blocks (a track of hours never sits in memory)."""
    with open(path, "rb") as source:
        head = source.read(_HEAD_BYTES)
        data_at = next((pos for chunk_id, pos, _ in _chunks(head) if chunk_id == b"data"), None)
        if data_at is None:
            raise LabelFormatError("the WAV file has no data chunk within its first 64 KiB")
        size = min(struct.unpack_from("<I", head, data_at + 4)[0], path.stat().st_size - data_at - 8)
        digest = bound_digest(format_fields(head))
        source.seek(data_at + 8)
        for block in iter(lambda: source.read(min(_BLOCK_BYTES, size - source.tell() + data_at + 8)), b""):
            digest.update(block)
        header = bytearray(embed(head[: data_at + 8], label_for(digest.hexdigest())))
        struct.pack_into("<I", header, len(header) - 4, size)  # the data chunk keeps its own size
        struct.pack_into("<I", header, 4, len(header) - 8 + size + (size & 1))
        staging = path.with_name(path.name + ".labelling")
        try:
            with open(staging, "wb") as target:
                target.write(header)
                source.seek(data_at + 8)
                left = size + (size & 1)
                while left > 0 and (block := source.read(min(_BLOCK_BYTES, left))):
                    target.write(block)
                    left -= len(block)
            os.replace(staging, path)
        except BaseException:
            staging.unlink(missing_ok=True)
            raise
