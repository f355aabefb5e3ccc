"""The implicit label in an Ogg Opus file: an `AIGC=<json>` comment in its OpusTags header packet.

An Ogg Opus stream (RFC 7845) is pages carrying packets: OpusHead alone on the first page, OpusTags on
the next page(s), then audio packets starting on a fresh page. The label is added to OpusTags and the tag
pages are rebuilt (page numbers after them shift if their count changes, and every changed page gets a
new CRC). The hash covers the audio packets' bytes, so re-paging does not change it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

from cosyserve.service.labels.errors import LabelFormatError

FIELD = "AIGC"
_HEADER = struct.Struct("<4sBBqIIIB")  # capture, version, flags, granule, serial, sequence, crc, segments
_CONTINUED = 0x01


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else (crc << 1)
        table.append(crc & 0xFFFFFFFF)
    return table


_TABLE = _crc_table()


def _crc(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _TABLE[(crc >> 24) ^ byte]
    return crc


@dataclass(frozen=True)
class _Page:
    flags: int
    granule: int
    serial: int
    sequence: int
    lacing: bytes
    body: bytes
    raw: bytes | None = None  # the page's bytes as read (None: rebuild them)

    def to_bytes(self) -> bytes:
        if self.raw is not None:
            return self.raw
        head = _HEADER.pack(
            b"OggS", 0, self.flags, self.granule, self.serial, self.sequence, 0, len(self.lacing)
        )
        page = bytearray(head + self.lacing + self.body)
        struct.pack_into("<I", page, 22, _crc(bytes(page)))
        return bytes(page)


def _pages(data: bytes) -> tuple[list[_Page], bytes]:
    """The complete pages, and the bytes after them (part of a page still to come in a stream)."""
    pages, pos = [], 0
    while pos + _HEADER.size <= len(data):
        capture, _version, flags, granule, serial, sequence, _crc_value, count = _HEADER.unpack_from(
            data, pos
        )
        if capture != b"OggS":
            raise LabelFormatError("not an Ogg stream (or a damaged page)")
        lacing = data[pos + _HEADER.size : pos + _HEADER.size + count]
        end = pos + _HEADER.size + count + sum(lacing)
        if len(lacing) < count or end > len(data):
            break
        body = data[pos + _HEADER.size + count : end]
        pages.append(_Page(flags, granule, serial, sequence, lacing, body, data[pos:end]))
        pos = end
    if not pages and data[:4] != b"OggS":
        raise LabelFormatError("not an Ogg stream")
    return pages, data[pos:]


def _packets(pages: list[_Page]) -> list[tuple[bytes, int]]:
    """(packet, index of the page it ends on) for every packet that ends in `pages`."""
    packets, current = [], bytearray()
    for index, page in enumerate(pages):
        pos = 0
        for value in page.lacing:
            current += page.body[pos : pos + value]
            pos += value
            if value < 255:
                packets.append((bytes(current), index))
                current = bytearray()
    return packets


def _tags(pages: list[_Page]) -> tuple[bytes, int]:
    """The OpusTags packet and the index of its last page; LabelFormatError if not all there yet."""
    packets = _packets(pages)
    if not packets or not packets[0][0].startswith(b"OpusHead"):
        if packets:
            raise LabelFormatError("only Ogg Opus is labelled (this Ogg stream carries another codec)")
        raise LabelFormatError("the Ogg Opus headers are incomplete")
    if len(packets) < 2:
        raise LabelFormatError("the Ogg Opus headers are incomplete")
    tags, last_page = packets[1]
    if not tags.startswith(b"OpusTags"):
        raise LabelFormatError("the Ogg Opus stream has no OpusTags header")
    return tags, last_page


def _parse_tags(packet: bytes) -> tuple[bytes, list[bytes], bytes]:
    """(vendor, comments, extra bytes after them) of an OpusTags packet."""
    try:
        pos = 8
        (vendor_len,) = struct.unpack_from("<I", packet, pos)
        vendor = packet[pos + 4 : pos + 4 + vendor_len]
        pos += 4 + vendor_len
        (count,) = struct.unpack_from("<I", packet, pos)
        pos += 4
        comments = []
        for _ in range(count):
            (length,) = struct.unpack_from("<I", packet, pos)
            comments.append(packet[pos + 4 : pos + 4 + length])
            pos += 4 + length
    except struct.error:
        raise LabelFormatError("the OpusTags header is damaged") from None
    return vendor, comments, packet[pos:]


def _is_label(comment: bytes) -> bool:
    return comment.split(b"=", 1)[0].upper() == FIELD.encode()


def read(data: bytes) -> str | None:
    tags, _ = _tags(_pages(data)[0])
    for comment in _parse_tags(tags)[1]:
        if _is_label(comment):
            return comment.split(b"=", 1)[1].decode("utf-8", "replace")
    return None


def format_fields(data: bytes) -> bytes:
    """The OpusHead packet (channels, pre-skip, output gain, channel mapping): how the packets play."""
    pages, _ = _pages(data)
    _tags(pages)
    return _packets(pages)[0][0]


def payload(data: bytes) -> bytes:
    """The audio packets (every packet after the two headers), concatenated."""
    pages, _ = _pages(data)
    _tags(pages)
    return b"".join(packet for packet, _ in _packets(pages)[2:])


def strip(data: bytes) -> bytes:
    return _rebuild(data, None)


def embed(data: bytes, text: str) -> bytes:
    """The stream with `text` as its AIGC comment; a stream's first bytes work when they hold both headers
    (the page count of the tags must then stay the same, which a label of any sane size keeps)."""
    return _rebuild(data, text)


def _rebuild(data: bytes, text: str | None) -> bytes:
    pages, tail = _pages(data)
    tags, last = _tags(pages)
    if pages[last].lacing[-1] == 255 or _packets(pages[: last + 1])[-1][0] != tags:
        raise LabelFormatError("the Ogg stream has audio on its tag page, which Ogg Opus does not allow")
    vendor, comments, extra = _parse_tags(tags)
    kept = [c for c in comments if not _is_label(c)]
    if text is not None:
        kept.append(f"{FIELD}=".encode() + text.encode("utf-8"))
    packet = b"OpusTags" + struct.pack("<I", len(vendor)) + vendor + struct.pack("<I", len(kept))
    packet += b"".join(struct.pack("<I", len(c)) + c for c in kept) + extra
    first = pages[1]
    tag_pages = _paginate(packet, first.serial, first.sequence)
    shift = len(tag_pages) - last  # the tags were on pages 1..last
    rest = pages[last + 1 :]
    if shift:
        rest = [replace(p, sequence=p.sequence + shift, raw=None) for p in rest]
    return b"".join(p.to_bytes() for p in [pages[0], *tag_pages, *rest]) + tail


def _paginate(packet: bytes, serial: int, first_sequence: int) -> list[_Page]:
    """One packet on as many pages as it needs (at most 255 lacing values a page), granule 0."""
    lacing = [255] * (len(packet) // 255) + [len(packet) % 255]
    pages, pos, n = [], 0, 0
    while lacing:
        part, lacing = lacing[:255], lacing[255:]
        size = sum(part)
        flags = _CONTINUED if n else 0
        pages.append(_Page(flags, 0, serial, first_sequence + n, bytes(part), packet[pos : pos + size]))
        pos += size
        n += 1
    return pages
