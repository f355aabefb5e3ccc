"""CSV files a person opens in a spreadsheet: a cell a user wrote (a cue, an item's text, an error that
quotes it) that begins like a formula (`=HYPERLINK(…)`, `+cmd|…`, `@SUM(…)`) is written with a leading
apostrophe, the spreadsheets' mark for "text", so opening a user's report runs nothing. Numbers, negative
ones too, stay numbers."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def as_cell(value: Any) -> Any:
    """`value` as a CSV cell that a spreadsheet shows and never evaluates."""
    if not isinstance(value, str) or not value.startswith(FORMULA_STARTS):
        return value
    try:
        float(value)
        return value  # -0.25: a number
    except ValueError:
        return "'" + value


def csv_text(columns: Iterable[str], rows: Iterable[Mapping[str, Any]]) -> str:
    """A header and `rows` (only `columns`, in that order), every cell through `as_cell`."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows({key: as_cell(value) for key, value in row.items()} for row in rows)
    return buffer.getvalue()
