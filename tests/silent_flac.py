"""Digital silence as a FLAC stream, written frame by frame: a decode bomb of any length in milliseconds.

libsndfile takes ~10 s to encode the 598 s, 8-channel, 192 kHz bomb of test_api_hostile_input; the frames
of silence are CONSTANT subframes (what an encoder writes for it too), so each is a header, 3 bytes a
channel and two CRCs. libFLAC checks both CRCs when it decodes (a wrong one loses sync)."""

from __future__ import annotations

import struct

BLOCK = 16384  # samples a channel per frame; block size code 0b1110 (the subset's limit above 48 kHz)


def _crc_table(poly: int, width: int) -> list[int]:
    top, mask = 1 << (width - 1), (1 << width) - 1
    table = []
    for byte in range(256):
        crc = byte << (width - 8)
        for _ in range(8):
            crc = ((crc << 1) ^ poly) & mask if crc & top else (crc << 1) & mask
        table.append(crc)
    return table


_CRC8, _CRC16 = _crc_table(0x07, 8), _crc_table(0x8005, 16)


def _crc8(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc = _CRC8[crc ^ byte]
    return crc


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[(crc >> 8) ^ byte]
    return crc


def _frame_number(n: int) -> bytes:
    """A frame number in FLAC's UTF-8-like coding (as UTF-8 for n < 0x10000, longer forms beyond)."""
    if n < 0x80:
        return bytes([n])
    for length, limit in ((2, 1 << 11), (3, 1 << 16), (4, 1 << 21), (5, 1 << 26), (6, 1 << 31)):
        if n < limit:
            tail = [0x80 | (n >> (6 * i)) & 0x3F for i in range(length - 2, -1, -1)]
            return bytes([(0xFF << (8 - length)) & 0xFF | n >> (6 * (length - 1)), *tail])
    raise ValueError(f"frame number {n} does not fit 31 bits")


def silent_flac(rate: int, channels: int, seconds: float) -> bytes:
    """`seconds` of 16-bit silence in `channels` channels at `rate` Hz, as a FLAC file whose STREAMINFO
    gives the exact length (no MD5: all zeros means unknown)."""
    total = int(rate * seconds)
    info = struct.pack(">HH", BLOCK, BLOCK) + bytes(6)  # min/max frame sizes 0: unknown
    info += ((rate << 44) | ((channels - 1) << 41) | (15 << 36) | total).to_bytes(8, "big") + bytes(16)
    parts = [b"fLaC", bytes([0x80, 0, 0, len(info)]), info]  # the last (only) metadata block
    subframes = bytes(3) * channels  # CONSTANT, no wasted bits, value 0 in 16 bits
    for number, start in enumerate(range(0, total, BLOCK)):
        size = min(BLOCK, total - start)
        code, size_bits = (0b1110, b"") if size == BLOCK else (0b0111, struct.pack(">H", size - 1))
        # sync + fixed block size; block size, rate from STREAMINFO; independent channels, 16 bits
        header = bytes([0xFF, 0xF8, code << 4, (channels - 1) << 4 | 0b1000])
        header += _frame_number(number) + size_bits
        frame = header + bytes([_crc8(header)]) + subframes
        parts.append(frame + struct.pack(">H", _crc16(frame)))
    return b"".join(parts)
