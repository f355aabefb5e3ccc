"""The "optional parts" note: which of noise reduction and prompt transcription this server has, and for
a missing one the exact commands that add it (shown beside the prompt and in the admin tab).

The note and the switches come from the same `OptionalPart` list, read once when the page is built, so
the page never offers a switch it says is missing, nor hides one it says is there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gradio as gr

from cosyserve.ui.bridge import OptionalPart
from cosyserve.ui.i18n import Translator, text


def parts_markdown(parts: Sequence[OptionalPart], lang: str) -> str:
    """One line per part: ✓ installed, or ✗ what is missing and the commands that add it."""
    lines = [f"**{text('parts_title', lang)}**"]
    for part in parts:
        label = text(f"part_{part.name}", lang)
        if part.installed:
            lines.append("- " + text("part_on", lang, label=label))
            continue
        missing = text("part_list", lang).join(text(f"part_{what}", lang) for what in part.missing)
        commands = text("part_then", lang).join(f"`{command}`" for command in part.commands)
        lines.append("- " + text("part_off", lang, label=label, missing=missing, commands=commands))
    return "\n".join(lines)


def parts_note(tr: Translator, parts: Sequence[OptionalPart], elem_id: str) -> Any:
    """The note as a Markdown block that follows the page's language."""
    chosen = list(parts)
    return tr.bind(
        gr.Markdown(parts_markdown(chosen, tr.lang), elem_id=elem_id, elem_classes="cosy-parts"),
        value=lambda lang: parts_markdown(chosen, lang),
    )
