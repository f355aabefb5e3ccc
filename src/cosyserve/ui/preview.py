"""The text preview ("发音/文本预览"): how the model will read a text, as HTML, before generating and for
every result: the spoken form with pronunciation tokens and tags highlighted, where it differs from the
official reading, the instruction actually used, the sentence split (with timings once there is audio),
the tokens of each LM input, and the warnings. The service computes it (`service.text_preview`, through
`UiBridge.text_preview`); this module only renders it."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from cosyserve.errors import CosyServeError
from cosyserve.ui.bridge import PLAIN, PRONUNCIATION, ReadingFields, Span, TextPreview
from cosyserve.ui.i18n import text
from cosyserve.ui.i18n_warnings import say_warnings
from cosyserve.ui.messages import error_message


def highlight(spans: Sequence[Span]) -> str:
    """The spoken text escaped, with native pronunciation tokens (`[ch][óng]`) and control tags marked."""
    out = []
    for span in spans:
        if span.kind == PLAIN:
            out.append(html.escape(span.text))
        else:
            kind = "cosy-pron" if span.kind == PRONUNCIATION else "cosy-tag"
            out.append(f'<mark class="{kind}">{html.escape(span.text)}</mark>')
    return "".join(out)


def _when(timing: dict[str, Any]) -> str:
    return f"<span class='cosy-when'>{timing['start_s']:.2f}–{timing['end_s']:.2f} s</span>"


def _paired(description: TextPreview, timings: Sequence[dict[str, Any]]) -> bool:
    """Whether a result's timings are this preview's sentences, one each (or the first of them, for a
    result stopped midway): a long text's job splits each of its pieces on its own, so its sentences
    need not be the whole text's."""
    typed = [str(timing.get("text", "")) for timing in timings]
    return description.written is not None and typed == list(description.written[: len(typed)])


def _sentence_rows(
    description: TextPreview, timings: Sequence[dict[str, Any]] | None, lang: str
) -> tuple[str, int]:
    """The sentence list as HTML, and how many sentences it names."""
    if timings is not None and not _paired(description, timings):
        return _timed_rows(timings)
    rows = []
    for index, segment in enumerate(description.segments):
        timing = timings[index] if timings is not None and index < len(timings) else None
        when = _when(timing) if timing else f"<span class='cosy-when'>{text('pv_timing_later', lang)}</span>"
        rows.append(f"<li>{highlight(segment)} {when}</li>")
    return f"<ol class='cosy-sentences'>{''.join(rows)}</ol>", len(rows)


def _timed_rows(timings: Sequence[dict[str, Any]]) -> tuple[str, int]:
    """The result's own sentences with their times, as typed (a timing without text continues the one
    before it)."""
    rows: list[tuple[str, dict[str, Any]]] = []
    for timing in timings:
        said = str(timing.get("text", "")).strip()
        if said or not rows:
            rows.append((said, dict(timing)))
        else:
            rows[-1][1]["end_s"] = max(float(timing["end_s"]), float(rows[-1][1]["end_s"]))
    items = "".join(f"<li>{html.escape(said)} {_when(timing)}</li>" for said, timing in rows)
    return f"<ol class='cosy-sentences' data-from='result'>{items}</ol>", len(rows)


def preview_html(description: TextPreview, lang: str, timings: Sequence[dict[str, Any]] | None = None) -> str:
    """The preview the service made; `timings` (the manifest's sentences) once there is audio."""
    parts = [f"<div class='cosy-preview' data-mode='{html.escape(description.mode)}'>"]
    spoken = highlight(description.spoken)
    parts.append(f"<p><b>{text('pv_spoken', lang)}</b> <span class='cosy-spoken'>{spoken}</span></p>")
    if description.corrections:
        items = "".join(
            f"<li>{html.escape(c.written)} → {html.escape(c.reading)} <small>({html.escape(c.rule)})</small>"
            "</li>"
            for c in description.corrections
        )
        parts.append(f"<p><b>{text('pv_corrections', lang)}</b></p><ul>{items}</ul>")
    mode = text(f"mode_{description.mode}", lang)
    if description.instruction:
        mode += f" · {text('pv_instruction', lang)} <q>{html.escape(description.instruction)}</q>"
    parts.append(f"<p><b>{text('pv_mode', lang)}</b> {mode}</p>")
    rows, count = _sentence_rows(description, timings, lang)
    parts.append(f"<p><b>{text('pv_sentences', lang, count=count)}</b></p>")
    parts.append(rows)
    tokens = "".join(
        f"<li><code>{' | '.join(html.escape(piece) for piece in pieces)}</code></li>"
        for pieces in description.lm_pieces
    )
    summary = f"<summary>{text('pv_tokens', lang)}</summary>"
    parts.append(f"<details>{summary}<ol class='cosy-tokens'>{tokens}</ol></details>")
    if description.warnings:
        warned = "".join(f"<li>{html.escape(w)}</li>" for w in say_warnings(description.warnings, lang))
        parts.append(f"<ul class='cosy-warnings'>{warned}</ul>")
    parts.append("</div>")
    return "".join(parts)


def preview_error_html(message: str) -> str:
    return f"<div class='cosy-preview'><p class='bad'>{html.escape(message)}</p></div>"


def form_preview(
    bridge: Any, principal: Any, form: Any, lang: str, timings: Sequence[dict[str, Any]] | None = None
) -> str:
    """The preview for what a mode tab holds (its saved voice, transcript and instruction), or the reason
    there is none (an empty text, a bad pronunciation, no model yet) in its place."""
    words = (form.text or "").strip()
    if not words:
        return ""
    try:
        fields = ReadingFields(form.mode, form.voice or None, form.transcript, form.instruct, form.preset)
        description = bridge.text_preview(principal, words, fields, with_written=timings is not None)
    except CosyServeError as exc:  # a voice deleted meanwhile reads as in the rest of the page
        return preview_error_html(error_message(exc, lang))
    return preview_html(description, lang, timings)
