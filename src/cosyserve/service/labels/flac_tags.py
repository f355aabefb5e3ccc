"""The implicit label in a FLAC file: an `AIGC=<json>` entry in its VORBIS_COMMENT metadata block.

A FLAC file is `fLaC`, metadata blocks (the last one flagged), then audio frames. The label joins the
file's one VORBIS_COMMENT block (created after STREAMINFO when there is none); the hash covers the
frames. A streamed FLAC's first bytes hold the whole metadata, so the same code labels its header.
"""

from __future__ import annotations

import struct

from cosyserve.service.labels import id3_tags
from cosyserve.service.labels.errors import LabelFormatError

FIELD = "AIGC"
_STREAMINFO, _VORBIS_COMMENT = 0, 4
_MAX_BLOCK = (1 << 24) - 1


def _start(data: bytes) -> int:
    """Where `fLaC` is: after any ID3v2 tags in front (C2PA puts its manifest in one there)."""
    pos = 0
    while (end := id3_tags.tag_end(data, pos)) != pos:
        pos = end
    return pos


def _blocks(data: bytes) -> tuple[list[tuple[int, bytes]], int]:
    """[(block type, body)] and the offset where the audio frames begin."""
    start = _start(data)
    if data[start : start + 4] != b"fLaC":
        raise LabelFormatError("not a FLAC file")
    blocks, pos = [], start + 4
    while True:
        if pos + 4 > len(data):
            raise LabelFormatError("the FLAC metadata is incomplete")
        head = data[pos]
        size = int.from_bytes(data[pos + 1 : pos + 4], "big")
        if pos + 4 + size > len(data):
            raise LabelFormatError("the FLAC metadata is incomplete")
        blocks.append((head & 0x7F, data[pos + 4 : pos + 4 + size]))
        pos += 4 + size
        if head & 0x80:
            return blocks, pos


def _comments(body: bytes) -> tuple[bytes, list[bytes]]:
    """(vendor, entries) of a VORBIS_COMMENT body (little-endian lengths)."""
    try:
        (vendor_len,) = struct.unpack_from("<I", body, 0)
        vendor = body[4 : 4 + vendor_len]
        pos = 4 + vendor_len
        (count,) = struct.unpack_from("<I", body, pos)
        pos += 4
        entries = []
        for _ in range(count):
            (length,) = struct.unpack_from("<I", body, pos)
            entries.append(body[pos + 4 : pos + 4 + length])
            pos += 4 + length
    except struct.error:
        raise LabelFormatError("the FLAC comment block is damaged") from None
    return vendor, entries


def _comment_body(vendor: bytes, entries: list[bytes]) -> bytes:
    out = struct.pack("<I", len(vendor)) + vendor + struct.pack("<I", len(entries))
    return out + b"".join(struct.pack("<I", len(e)) + e for e in entries)


def is_label(entry: bytes) -> bool:
    return entry.split(b"=", 1)[0].upper() == FIELD.encode()


def read(data: bytes) -> str | None:
    for block_type, body in _blocks(data)[0]:
        if block_type == _VORBIS_COMMENT:
            for entry in _comments(body)[1]:
                if is_label(entry):
                    return entry.split(b"=", 1)[1].decode("utf-8", "replace")
    return None


def format_fields(data: bytes) -> bytes:
    """The STREAMINFO block (sample rate, channels, bits, length): how the frames play."""
    for block_type, body in _blocks(data)[0]:
        if block_type == _STREAMINFO:
            return body
    raise LabelFormatError("the FLAC file has no STREAMINFO block")


def payload(data: bytes) -> bytes:
    return data[_blocks(data)[1] :]


def strip(data: bytes) -> bytes:
    return _rebuild(data, None)


def embed(data: bytes, text: str) -> bytes:
    return _rebuild(data, text)


def _rebuild(data: bytes, text: str | None) -> bytes:
    blocks, audio_at = _blocks(data)
    ours = [f"{FIELD}=".encode() + text.encode("utf-8")] if text is not None else []
    has_comments = any(t == _VORBIS_COMMENT for t, _ in blocks)
    rebuilt: list[tuple[int, bytes]] = []
    for block_type, body in blocks:
        if block_type == _VORBIS_COMMENT:
            vendor, entries = _comments(body)
            body = _comment_body(vendor, [e for e in entries if not is_label(e)] + ours)
        rebuilt.append((block_type, body))
        if block_type == _STREAMINFO and not has_comments and ours:
            rebuilt.append((_VORBIS_COMMENT, _comment_body(b"cosyserve", ours)))
    out = bytearray(data[: _start(data)] + b"fLaC")
    for n, (block_type, body) in enumerate(rebuilt):
        if len(body) > _MAX_BLOCK:
            raise LabelFormatError("the FLAC metadata block would be too large for the label")
        last = 0x80 if n == len(rebuilt) - 1 else 0
        out += bytes([last | block_type]) + len(body).to_bytes(3, "big") + body
    return bytes(out) + data[audio_at:]
