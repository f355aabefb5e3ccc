"""Sentence timestamps as SRT and WebVTT subtitles."""

from __future__ import annotations

from collections.abc import Sequence

from cosyserve.service.requests import SentenceTiming


def _clock(seconds: float, separator: str) -> str:
    millis = round(max(0.0, seconds) * 1000)
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def to_srt(timings: Sequence[SentenceTiming]) -> str:
    blocks = [
        f"{n}\n{_clock(t.start_s, ',')} --> {_clock(t.end_s, ',')}\n{t.text.strip()}\n"
        for n, t in enumerate(timings, start=1)
    ]
    return "\n".join(blocks)


def to_vtt(timings: Sequence[SentenceTiming]) -> str:
    blocks = [f"{_clock(t.start_s, '.')} --> {_clock(t.end_s, '.')}\n{t.text.strip()}\n" for t in timings]
    return "WEBVTT\n\n" + "\n".join(blocks)
