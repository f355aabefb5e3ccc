"""What kind of result a history entry is, the history tab's search and filters, and its download links.

The kind comes from the manifest: the API endpoint or UI job that made it (`parameters.endpoint`: a dub's
track and items say "dub" or "ui-dub", a batch's items "batches" or "ui-batch" and carry a `batch_id`),
the UI's mode (`parameters.ui_mode`), and otherwise the request fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import tzinfo
from typing import Any

from cosyserve.ui.bridge import MODES, StoredOutput, UiBridge
from cosyserve.ui.generate import download_links
from cosyserve.ui.i18n import text
from cosyserve.ui.local_times import local_text

KINDS = (*MODES, "batch", "dub", "api", "preview")
DUB_ENDPOINTS = frozenset({"dub", "ui-dub"})
BATCH_ENDPOINTS = frozenset({"batches", "ui-batch"})
UPLOADED = "~uploaded"  # the voice filter's value for results made from an uploaded recording
ANY = "*"  # the dropdowns' value for "all"


def output_mode(manifest: dict[str, Any]) -> str:
    """One of `KINDS`: the UI mode it was made in, batch or dub, a voice preview, or "api" for what the API
    made with a saved voice outside these."""
    parameters = manifest.get("parameters") or {}
    endpoint = str(parameters.get("endpoint") or "")
    if endpoint in DUB_ENDPOINTS:
        return "dub"
    if endpoint in BATCH_ENDPOINTS or parameters.get("batch_id"):
        return "batch"
    mode = parameters.get("ui_mode")
    if mode in MODES or mode == "preview" or endpoint == "preview":  # a library preview is one
        return mode if mode in MODES else "preview"
    if (manifest.get("instruct") or "").strip():
        return "instruct"
    if (manifest.get("prompt_text") or "").strip():
        return "zero_shot"
    if manifest.get("voice") and manifest.get("prompt_text") is None:
        return "api"
    return "cross_lingual"


def output_day(output: StoredOutput, zone: tzinfo | None) -> str:
    """The date it was made in `zone`, YYYY-MM-DD (the operator's: the table's times and file names)."""
    return local_text(output.created_at, zone, "%Y-%m-%d")


@dataclass(frozen=True)
class HistoryFilter:
    """What the user narrowed the history to; empty fields match everything."""

    query: str = ""  # words of the text, or part of the id (case-insensitive)
    voice: str | None = None  # a saved voice's id, UPLOADED, or None for any
    kind: str | None = None  # one of KINDS, or None for any
    day: str | None = None  # YYYY-MM-DD, or None for any
    zone: tzinfo | None = None  # the zone `day` is a date of

    @property
    def active(self) -> bool:
        return bool(self.query.strip()) or any(v is not None for v in (self.voice, self.kind, self.day))

    def matches(self, output: StoredOutput) -> bool:
        m = output.manifest
        if self.kind is not None and output_mode(m) != self.kind:
            return False
        if self.voice is not None and (m.get("voice") or UPLOADED) != self.voice:
            return False
        if self.day is not None and output_day(output, self.zone) != self.day:
            return False
        words = self.query.casefold().split()
        haystack = f"{m.get('text') or ''} {m.get('instruct') or ''} {output.id}".casefold()
        return all(word in haystack for word in words)

    def apply(self, outputs: list[StoredOutput], limit: int) -> list[StoredOutput]:
        return [output for output in outputs if self.matches(output)][:limit]


def filter_from(
    query: str | None, voice: str | None, kind: str | None, day: str | None, zone: tzinfo | None = None
) -> HistoryFilter:
    """A filter from the tab's fields (a dropdown's "all" is None; an unknown kind matches nothing)."""
    return HistoryFilter(
        zone=zone,
        query=(query or "")[:200],
        voice=voice if voice is not None and voice != ANY else None,
        kind=kind if kind and kind != ANY else None,
        day=day if day and day != ANY else None,
    )


def voice_choices(outputs: list[StoredOutput], names: dict[str, str], any_label: str, uploaded: str) -> list:
    """(label, value) for each voice the listed results used, after "all"."""
    seen: dict[str, str] = {}
    for output in outputs:
        voice = output.manifest.get("voice") or UPLOADED
        seen.setdefault(voice, uploaded if voice == UPLOADED else names.get(voice, voice))
    return [(any_label, ANY), *sorted(((label, value) for value, label in seen.items()), key=str)]


def day_choices(outputs: list[StoredOutput], any_label: str, zone: tzinfo | None) -> list:
    """(label, value) for each day with a result in `zone`, newest first, after "all"."""
    days = sorted({output_day(output, zone) for output in outputs}, reverse=True)
    return [(any_label, ANY), *((day, day) for day in days)]


def history_links(bridge: UiBridge, output: StoredOutput, lang: str) -> str:
    """Signed download links in every format and the subtitles (SRT), labelled in `lang`."""

    def labels(fmt: str) -> tuple[str, str]:
        label = text("history_download", lang, fmt=fmt)
        return label, label

    return download_links(bridge, output, lang, labels)
