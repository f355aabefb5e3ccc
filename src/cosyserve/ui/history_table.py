"""The history tab's table: one row per result (time, mode, text, voice, seed, seconds, id), and whose it
is in an admin's "Everyone's entries"; the column widths keep the id, last, whole."""

from __future__ import annotations

import time
from typing import Any

from cosyserve.ui.bridge import Principal, StoredOutput
from cosyserve.ui.history_filter import output_mode
from cosyserve.ui.i18n import text
from cosyserve.ui.studio import UiContext

ID_PREFIX = "output_"  # left out of the table's id column, which stays narrow
COLUMN_WIDTHS = ["13%", "10%", "27%", "14%", "11%", "8%", "17%"]
OWNER_COLUMN_WIDTHS = ["12%", "9%", "23%", "12%", "11%", "10%", "7%", "16%"]  # an Owner after the voice


def history_rows(
    ctx: UiContext,
    principal: Principal,
    outputs: list[StoredOutput],
    lang: str,
    owners: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The table's rows; `owners` (an admin's "Everyone's entries": owner → the key's name) adds whose
    each entry is, after its voice."""
    headers = text("history_cols", lang).split("|")
    if owners is not None:
        headers.insert(4, text("history_owner", lang))
    voices = {voice.id: voice.name for voice in ctx.bridge.voices(principal)}
    rows = []
    for output in outputs:
        m = output.manifest
        mode = output_mode(m)
        created = time.strftime("%m-%d %H:%M:%S", time.localtime(output.created_at))
        voice = voices.get(m.get("voice") or "", m.get("voice")) or text("uploaded", lang)
        row = [
            created,
            text(f"mode_{mode}", lang),
            (m.get("text") or "")[:60],
            voice,
            m.get("seed"),
            m.get("duration_s"),
            output.id.removeprefix(ID_PREFIX),
        ]
        if owners is not None:
            row.insert(4, _owner_name(m.get("owner"), owners, lang))
        rows.append(row)
    return {"headers": headers, "data": rows}


def _owner_name(owner: str | None, owners: dict[str, str], lang: str) -> str:
    """A key's name for `key:<id>`, the user name for `user:<name>`, "(none)" for no owner."""
    if not owner:
        return text("owner_nobody", lang)
    return owners.get(owner) or owner.removeprefix("user:")
