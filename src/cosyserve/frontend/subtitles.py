"""Reading subtitle files: SRT and WebVTT cues (start, end, text) for dubbing.

Both formats are read leniently where players are (a BOM, CRLF line ends, `,` or `.` before the
milliseconds, hours left out in WebVTT, cue settings after the end time, missing cue numbers) and strictly
where a guess would misplace speech (a time that does not parse, an end before its start). Markup is
removed from the text: `<i>`, `<b>`, `<c.x>`, `<v Name>`, timestamps inside a cue, `{\\an8}`-style SSA
tags; lines of one cue are joined with a space.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from cosyserve.errors import InputError

MAX_CUES = 100_000
_TIME = re.compile(r"(?:(\d{1,3}):)?([0-5]?\d):([0-5]\d)[,.](\d{1,3})")
_TIMING = re.compile(rf"^\s*({_TIME.pattern})\s*-->\s*({_TIME.pattern})(?:\s+.*)?$")
_TAGS = re.compile(r"<[^<>]*>|\{\\[^{}]*\}")
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class Cue:
    """One subtitle: when it is shown, and what is said."""

    index: int  # 1, 2, ... in time order
    start_s: float
    end_s: float
    text: str  # markup removed, lines joined

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def parse_subtitles(data: str | bytes, *, what: str = "the subtitle file") -> list[Cue]:
    """The cues of an SRT or WebVTT file in time order (InputError, naming the line, when it is not one)."""
    text = _decode(data, what)
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    webvtt = bool(lines) and lines[0].startswith("WEBVTT")
    cues: list[tuple[float, float, str, int]] = []
    i = 1 if webvtt else 0
    while i < len(lines):
        line = lines[i]
        if webvtt and line.startswith(("NOTE", "STYLE", "REGION")) and "-->" not in line:
            i = _skip_block(lines, i)
            continue
        match = _TIMING.match(line)
        if match is None:
            i += 1  # a cue number or identifier, a blank line; anything else is checked below
            if line.strip() and "-->" in line:
                raise InputError(
                    f"{what}, line {i}: {line.strip()[:80]!r} is not a time range like "
                    "00:00:01,000 --> 00:00:02,500"
                )
            continue
        start, end = _seconds(match.group(1)), _seconds(match.group(6))
        if end <= start:
            raise InputError(
                f"{what}, line {i + 1}: the cue ends ({match.group(6)}) before it starts "
                f"({match.group(1)}): fix its times"
            )
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() and not _TIMING.match(lines[i]):
            body.append(lines[i])
            i += 1
        cues.append((start, end, _clean(body), i))
        if len(cues) > MAX_CUES:
            raise InputError(f"{what} has more than {MAX_CUES} cues: split it")
    if not cues:
        raise InputError(f"{what} has no cues: give an SRT or WebVTT file (00:00:01,000 --> 00:00:02,500)")
    cues.sort(key=lambda cue: (cue[0], cue[1]))
    for previous, current in itertools.pairwise(cues):
        if current[0] == previous[0]:
            raise InputError(
                f"{what}: two cues start at {_clock(current[0])}: "
                "a voice-over speaks one at a time, merge them"
            )
    return [Cue(n, start, end, body) for n, (start, end, body, _) in enumerate(cues, start=1)]


def _decode(data: str | bytes, what: str) -> str:
    if isinstance(data, str):
        return data.lstrip("\ufeff")
    for encoding in ("utf-8-sig", "utf-16"):
        try:
            return data.decode(encoding).lstrip("\ufeff")
        except UnicodeDecodeError:
            if not data.startswith((b"\xff\xfe", b"\xfe\xff")):
                break
    raise InputError(f"{what} is not UTF-8 text: save it as UTF-8")


def _skip_block(lines: list[str], i: int) -> int:
    while i < len(lines) and lines[i].strip():
        i += 1
    return i


def _seconds(stamp: str) -> float:
    match = _TIME.fullmatch(stamp)
    if match is None:  # pragma: no cover - _TIMING matched the same pattern
        raise InputError(f"{stamp!r} is not a time")
    hours, minutes, seconds, millis = match.groups()
    fraction = int(millis.ljust(3, "0")) / 1000
    return int(hours or 0) * 3600 + int(minutes) * 60 + int(seconds) + fraction


def _clean(body: list[str]) -> str:
    return _SPACES.sub(" ", " ".join(_TAGS.sub("", line) for line in body)).strip()


def _clock(seconds: float) -> str:
    millis = round(seconds * 1000)
    hours, minutes, seconds = millis // 3_600_000, millis // 60_000 % 60, millis // 1000 % 60
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}.{millis % 1000:03d}"
