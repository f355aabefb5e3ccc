"""Sentence timestamps as SRT and WebVTT subtitles: the one builder for every surface (CLI, API, UI,
batch archives, dub tracks).

Each timing is one spoken segment with the text the user typed for it (`PreparedText.written_segments`).
A timing without text continues the cue before it (a typed sentence spoken as several segments): the cue
is shown until its last segment ends, so every cue holds whole typed sentences.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cosyserve.service.outcomes import SentenceTiming


def _clock(seconds: float, separator: str) -> str:
    millis = round(max(0.0, seconds) * 1000)
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def manifest_timings(manifest: Mapping[str, Any]) -> list[SentenceTiming]:
    """The sentence timings an output's manifest records (`sentences`), for its subtitles."""
    return [
        SentenceTiming(int(s["index"]), str(s["text"]), float(s["start_s"]), float(s["end_s"]))
        for s in manifest.get("sentences") or []
    ]


def cues(timings: Sequence[SentenceTiming]) -> list[tuple[float, float, str]]:
    """(start, end, text) per cue: a timing without text extends the cue before it; no blank lines in a
    text (a blank line would end the cue in the file)."""
    out: list[tuple[float, float, str]] = []
    for timing in timings:
        text = "\n".join(line.strip() for line in timing.text.strip().splitlines() if line.strip())
        if not text and out:
            start, _, before = out[-1]
            out[-1] = (start, max(timing.end_s, out[-1][1]), before)
        elif text:
            out.append((timing.start_s, timing.end_s, text))
    return out


def to_srt(timings: Sequence[SentenceTiming]) -> str:
    blocks = [
        f"{n}\n{_clock(start, ',')} --> {_clock(end, ',')}\n{text}\n"
        for n, (start, end, text) in enumerate(cues(timings), start=1)
    ]
    return "\n".join(blocks)


def to_vtt(timings: Sequence[SentenceTiming]) -> str:
    blocks = [f"{_clock(start, '.')} --> {_clock(end, '.')}\n{text}\n" for start, end, text in cues(timings)]
    return "WEBVTT\n\n" + "\n".join(blocks)
