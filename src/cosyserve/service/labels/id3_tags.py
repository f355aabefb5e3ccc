"""The implicit label in an MP3 file: a `TXXX` frame described `AIGC` in an ID3v2 tag at the start.

MP3 decoders skip a leading ID3v2 tag, and streams can begin with one, so streamed MP3 is labelled the
same way. An existing ID3v2.3/2.4 tag keeps its other frames (a tag using unsynchronisation or an
extended header is refused rather than rewritten wrongly); a new tag is ID3v2.4 with a UTF-8 frame.
The hash covers the MPEG frames: everything after the leading tag(s), without a trailing ID3v1 tag.
"""

from __future__ import annotations

import struct

from cosyserve.service.labels.errors import LabelFormatError

FIELD = "AIGC"
_ID3V1_SIZE = 128
_FOOTER = 0x10
_UNSYNC, _EXTENDED = 0x80, 0x40


def _syncsafe(value: bytes) -> int:
    return (value[0] << 21) | (value[1] << 14) | (value[2] << 7) | value[3]


def _to_syncsafe(value: int) -> bytes:
    if value >= 1 << 28:
        raise LabelFormatError("the ID3 tag would be too large")
    return bytes([(value >> 21) & 0x7F, (value >> 14) & 0x7F, (value >> 7) & 0x7F, value & 0x7F])


def tag_end(data: bytes, pos: int = 0) -> int:
    """Where the ID3v2 tag starting at `pos` ends (`pos` when there is none)."""
    if data[pos : pos + 3] != b"ID3" or len(data) < pos + 10:
        return pos
    end = pos + 10 + _syncsafe(data[pos + 6 : pos + 10]) + (10 if data[pos + 5] & _FOOTER else 0)
    if end > len(data):
        raise LabelFormatError("the ID3 tag is incomplete")
    return end


def _frames(tag: bytes) -> tuple[int, list[tuple[bytes, bytes, bytes]]]:
    """(major version, [(frame id, flags, body)]) of one ID3v2.3/2.4 tag."""
    version, flags = tag[3], tag[5]
    if version not in (3, 4):
        raise LabelFormatError(f"ID3v2.{version} tags are not supported; ID3v2.3 and 2.4 are")
    if flags & (_UNSYNC | _EXTENDED):
        raise LabelFormatError("ID3 tags with unsynchronisation or an extended header are not supported")
    body_end = 10 + _syncsafe(tag[6:10])
    frames, pos = [], 10
    while pos + 10 <= body_end and tag[pos] != 0:
        frame_id = tag[pos : pos + 4]
        raw_size = tag[pos + 4 : pos + 8]
        size = _syncsafe(raw_size) if version == 4 else struct.unpack(">I", raw_size)[0]
        frames.append((frame_id, tag[pos + 8 : pos + 10], tag[pos + 10 : pos + 10 + size]))
        pos += 10 + size
    return version, frames


def _decode(encoding: int, raw: bytes) -> str:
    codec = {0: "latin-1", 1: "utf-16", 2: "utf-16-be", 3: "utf-8"}.get(encoding, "utf-8")
    return raw.decode(codec, "replace")


def _txxx(body: bytes) -> tuple[str, str] | None:
    """(description, value) of a TXXX frame body."""
    if not body:
        return None
    encoding, rest = body[0], body[1:]
    terminator = b"\0\0" if encoding in (1, 2) else b"\0"
    at = 0
    while True:
        at = rest.find(terminator, at)
        if at < 0:
            return None
        if len(terminator) == 1 or at % 2 == 0:
            break
        at += 1
    value = rest[at + len(terminator) :]
    while value.endswith(terminator) and len(value) % len(terminator) == 0:  # a trailing terminator
        value = value[: -len(terminator)]
    return _decode(encoding, rest[:at]), _decode(encoding, value)


def _is_label(frame_id: bytes, body: bytes) -> bool:
    if frame_id != b"TXXX":
        return False
    parsed = _txxx(body)
    return parsed is not None and parsed[0] == FIELD


def read(data: bytes) -> str | None:
    end = tag_end(data)
    if end == 0:
        return None
    for frame_id, _flags, body in _frames(data[:end])[1]:
        if _is_label(frame_id, body):
            parsed = _txxx(body)
            return parsed[1] if parsed else None
    return None


def format_fields(data: bytes) -> bytes:
    """Nothing apart: each MPEG frame's own header (rate, channels) is in the payload."""
    del data
    return b""


def payload(data: bytes) -> bytes:
    pos = 0
    while (end := tag_end(data, pos)) != pos:
        pos = end
    tail = len(data)
    if len(data) - pos >= _ID3V1_SIZE and data[-_ID3V1_SIZE:][:3] == b"TAG":
        tail -= _ID3V1_SIZE
    return data[pos:tail]


def strip(data: bytes) -> bytes:
    return _rebuild(data, None)


def embed(data: bytes, text: str) -> bytes:
    return _rebuild(data, text)


def _rebuild(data: bytes, text: str | None) -> bytes:
    end = tag_end(data)
    version, frames = _frames(data[:end]) if end else (4, [])
    kept = [(i, f, b) for i, f, b in frames if not _is_label(i, b)]
    if text is not None:
        if version == 4:
            body = b"\x03" + FIELD.encode() + b"\0" + text.encode("utf-8")
        else:  # ID3v2.3 has no UTF-8: UTF-16 with a byte order mark
            body = b"\x01" + FIELD.encode("utf-16") + b"\0\0" + text.encode("utf-16")
        kept.append((b"TXXX", b"\0\0", body))
    if not kept:
        return data[end:]
    frames_bytes = b""
    for frame_id, flags, body in kept:
        size = _to_syncsafe(len(body)) if version == 4 else struct.pack(">I", len(body))
        frames_bytes += frame_id + size + flags + body
    header = b"ID3" + bytes([version, 0, 0]) + _to_syncsafe(len(frames_bytes))
    return header + frames_bytes + data[end:]
