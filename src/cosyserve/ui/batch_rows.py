"""What the Batch tab shows of a batch: its progress bar, and each item's check and error in the page's
language (`i18n_batch.STRINGS`)."""

from __future__ import annotations

import html
from typing import Any

from cosyserve.ui.bridge import BatchItem, BatchStatus
from cosyserve.ui.i18n_batch import STRINGS
from cosyserve.ui.messages import stored_error_message
from cosyserve.ui.take_badge import check_names


def bt(key: str, lang: str, **values: Any) -> str:
    zh, en = STRINGS[key]
    template = zh if lang == "zh" else en
    return template.format(**values) if values else template


def item_error(item: BatchItem, lang: str) -> str:
    """Why an item failed or was cancelled, in the page's words (the stored message is the API's)."""
    if item.state == "done" and not item.output_id:  # its file was deleted since (History, the API)
        return bt("item_deleted", lang)
    if item.error_code == "voice_not_found":  # its line names a voice the batch's owner has not got
        return bt("item_no_voice", lang, voice=(item.params or {}).get("voice") or "?")
    return stored_error_message(item.error_code, item.error_message, lang)


def item_check(item: BatchItem, lang: str) -> str:
    """A finished item's checks: ✓, or ⚠ with the checks every take failed (empty: not scored)."""
    quality = (item.result or {}).get("quality")
    if item.state != "done" or not isinstance(quality, dict):
        return ""
    if quality.get("passed", True):
        return bt("check_passed", lang)
    return bt("check_listen", lang, failed=check_names(quality.get("failed"), lang))


def progress_html(status: BatchStatus, lang: str) -> str:
    """A progress bar with the counts, the state and the time left (the page reads `#batch-bar`)."""
    counts, record = status.counts, status.record
    made = counts.done + counts.failed  # made or tried: a cancelled item is neither
    line = bt("progress", lang, finished=made, total=counts.total, done=counts.done, failed=counts.failed)
    if counts.cancelled:
        line += f" · {bt('cancelled_n', lang, n=counts.cancelled)}"
    state = bt(f"state_{record.state}", lang)
    left = f" · {bt('left', lang, seconds=status.time_left_s)}" if status.time_left_s else ""
    said = stored_error_message(record.error_code, record.error_message, lang)
    error = f"<br><span class='bad'>{html.escape(said)}</span>" if record.error_code else ""
    return (
        f'<div class="cosy-batch" data-state="{record.state}" data-batch="{record.id}">'
        f'<progress id="batch-bar" style="width: 60%" value="{made}" max="{max(1, counts.total)}" '
        f'aria-label="{html.escape(line, quote=True)}">'
        "</progress> "
        f"<b>{state}</b> · {line}{left}{error}</div>"
    )
