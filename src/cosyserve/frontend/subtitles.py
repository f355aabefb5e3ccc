"""Reading subtitle files: SRT and WebVTT cues (start, end, text) for dubbing.

Both formats are read leniently where players are (a BOM, CRLF line ends, `,` or `.` before the
milliseconds, hours left out in WebVTT, cue settings after the end time, missing cue numbers) and strictly
where a guess would misplace speech (a time that does not parse, an end before its start). Markup is
removed from the text: `<i>`, `<b>`, `<c.x>`, `<v Name>`, timestamps inside a cue, `{\\an8}`-style SSA
tags; lines of one cue are joined with a space.

Cues are returned in time order (a voice-over is placed front to back); each keeps what the file called it
(`cue_id`: the SRT number or the WebVTT identifier, else its place in the file) and its place in the file
(`file_position`), so a report can say when the file's order was not the time order.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from cosyserve.errors import InputError

MAX_CUES = 100_000
MAX_ID_CHARS = 64  # of a cue's number or identifier, as reports show it
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
    cue_id: str = ""  # the file's own number (SRT) or identifier (WebVTT); else its file position
    file_position: int = 0  # 1, 2, ... in the order of the file

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def parse_subtitles(data: str | bytes, *, what: str = "the subtitle file") -> list[Cue]:
    """The cues of an SRT or WebVTT file in time order (InputError, naming the line, when it is not one)."""
    text = _decode(data, what)
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    webvtt = bool(lines) and lines[0].startswith("WEBVTT")
    cues: list[tuple[float, float, str, str]] = []  # start, end, text, the file's id for it
    label = ""  # the line just before a timing line: the cue's number or identifier
    i = 1 if webvtt else 0
    while i < len(lines):
        line = lines[i]
        if webvtt and line.startswith(("NOTE", "STYLE", "REGION")) and "-->" not in line:
            i = _skip_block(lines, i)
            label = ""
            continue
        match = _TIMING.match(line)
        if match is None:
            i += 1  # a cue number or identifier, a blank line; anything else is checked below
            if line.strip() and "-->" in line:
                raise InputError(
                    f"{what}, line {i}: {line.strip()[:80]!r} is not a time range like "
                    "00:00:01,000 --> 00:00:02,500"
                )
            label = line.strip()[:MAX_ID_CHARS]
            continue
        start, end = _seconds(match.group(1)), _seconds(match.group(6))
        if end == start:
            raise InputError(
                f"{what}, line {i + 1}: the cue has no length (it starts and ends at {match.group(1)}): "
                "give it an end after its start"
            )
        if end < start:
            raise InputError(
                f"{what}, line {i + 1}: the cue ends ({match.group(6)}) before it starts "
                f"({match.group(1)}): fix its times"
            )
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() and not _TIMING.match(lines[i]):
            if _numbers_next_cue(lines, i):  # no blank line before the next cue: its number is no speech
                break
            body.append(lines[i])
            i += 1
        cues.append((start, end, _clean(body), label or str(len(cues) + 1)))
        label = ""
        if len(cues) > MAX_CUES:
            raise InputError(f"{what} has more than {MAX_CUES} cues: split it")
    if not cues:
        raise InputError(f"{what} has no cues: give an SRT or WebVTT file (00:00:01,000 --> 00:00:02,500)")
    in_time = sorted(range(len(cues)), key=lambda k: (cues[k][0], cues[k][1]))
    for previous, current in itertools.pairwise(in_time):
        if cues[current][0] == cues[previous][0]:
            raise InputError(
                f"{what}: two cues start at {_clock(cues[current][0])} (cues {cues[previous][3]!r} and "
                f"{cues[current][3]!r}): a voice-over speaks one at a time, merge them"
            )
    return [
        Cue(n, cues[k][0], cues[k][1], cues[k][2], cue_id=cues[k][3], file_position=k + 1)
        for n, k in enumerate(in_time, start=1)
    ]


def _numbers_next_cue(lines: list[str], i: int) -> bool:
    """Is line `i` a cue number (digits alone) right before a timing line?"""
    return lines[i].strip().isdigit() and i + 1 < len(lines) and _TIMING.match(lines[i + 1]) is not None


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
