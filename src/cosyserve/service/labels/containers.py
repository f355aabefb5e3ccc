"""Which tag code handles which format, and telling a file's format from its first bytes."""

from __future__ import annotations

from types import ModuleType

from cosyserve.service.labels import flac_tags, id3_tags, ogg_tags, riff_tags
from cosyserve.service.labels.errors import LabelFormatError

# The formats that carry an implicit label; raw `pcm` has no container to put one in.
TAGGERS: dict[str, ModuleType] = {"wav": riff_tags, "flac": flac_tags, "mp3": id3_tags, "opus": ogg_tags}


def sniff(data: bytes) -> str | None:
    """The format of a file from its magic bytes (wav, flac, opus, mp3), or None if none of those."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    start = 0
    try:
        while (end := id3_tags.tag_end(data, start)) != start:  # C2PA fronts FLAC with an ID3 tag
            start = end
    except LabelFormatError:  # a tag longer than the bytes: a truncated file
        return "mp3"
    if data[start : start + 4] == b"fLaC":
        return "flac"
    if data[:4] == b"OggS":
        return "opus"
    if data[:3] == b"ID3" or (len(data) >= 2 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    return None
