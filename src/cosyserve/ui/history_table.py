"""The history tab's table: one row per result (time, mode, text, voice, seed, seconds, id), and whose it
is in an admin's "Everyone's entries"; the column widths keep the id, last, whole."""

from __future__ import annotations

from typing import Any

from cosyserve.ui.bridge import Principal, StoredOutput
from cosyserve.ui.history_filter import output_mode
from cosyserve.ui.i18n import text
from cosyserve.ui.local_times import local_text, zone_name
from cosyserve.ui.studio import UiContext

ID_PREFIX = "output_"  # left out of the table's id column, which stays narrow
COLUMN_WIDTHS = ["13%", "10%", "27%", "14%", "11%", "8%", "17%"]
OWNER_COLUMN_WIDTHS = ["12%", "9%", "23%", "12%", "11%", "10%", "7%", "16%"]  # an Owner after the voice
PHONE_TABLE_PX = 640  # below this window width the table keeps it and scrolls in its box


def phone_css() -> str:
    """On a phone the table scrolls in its box, `PHONE_TABLE_PX` wide, rather than wrap its columns one letter
    a line. Gradio sizes the header's cells from the percentages against the table's width but the body's
    (rows of a virtual list) against the visible box, half as wide on a phone: the body's cells get the
    header's widths here, for both layouts (7 columns, or 8 with an admin's Owner)."""
    rules = [f"#history-table table {{ min-width: {PHONE_TABLE_PX}px; }}"]
    for widths, which in (
        (COLUMN_WIDTHS, ":not(:has(> [data-col='7']))"),
        (OWNER_COLUMN_WIDTHS, ":has(> [data-col='7'])"),
    ):
        for column, percent in enumerate(widths):
            px = PHONE_TABLE_PX * float(percent.rstrip("%")) / 100
            rules.append(
                f"#history-table .virtual-row{which} > [data-col='{column}'] "
                f"{{ width: {px:.2f}px !important; flex: 0 0 {px:.2f}px !important; }}"
            )
    return f"@media (max-width: {PHONE_TABLE_PX}px) {{\n" + "\n".join(rules) + "\n}\n"


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
    zone = ctx.bridge.time_zone
    headers[0] = f"{headers[0]} ({zone_name(zone)})"
    if owners is not None:
        headers.insert(4, text("history_owner", lang))
    voices = {voice.id: voice.name for voice in ctx.bridge.voices(principal)}
    rows = []
    for output in outputs:
        m = output.manifest
        mode = output_mode(m)
        created = local_text(output.created_at, zone, "%m-%d %H:%M:%S")
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
