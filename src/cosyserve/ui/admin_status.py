"""What the admin tab shows, as Markdown: engine and queue, the GPUs (NVML), and recent activity.

The figures come from `UiBridge.status()` and the activity log lines (`service.activity`), so the tab
answers what ran, for whom, how fast, on which GPU and with how much memory free.
"""

from __future__ import annotations

import re
import time
from typing import Any

from cosyserve.ui.i18n import text
from cosyserve.ui.messages import as_written

ACTIVITY_ROWS = 15

# Terminal escape sequences (colours, cursor moves, window titles) that coloured loggers and tools write:
# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ESC \), charset and other nF escapes (ESC ( B), two-byte
# escapes, a C1 CSI (0x9b ... final), and a lone ESC.
ANSI_ESCAPE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[ -/]+[0-~]|\x1b[@-Z\\-_]"
    r"|\x9b[0-?]*[ -/]*[@-~]|\x1b"
)
DURATION_UNITS = (("unit_d", 86400), ("unit_h", 3600), ("unit_min", 60), ("unit_s", 1))


def strip_ansi(line: str) -> str:
    """`line` without terminal escape sequences, so a log shows as text rather than `[32m` noise."""
    return ANSI_ESCAPE.sub("", line)


def human_duration(seconds: float, lang: str) -> str:
    """A duration in its two largest units: 3 d 4 h, 2 h 14 min, 5 min 3 s, 42 s (Chinese: 3 天 4 小时)."""
    remaining = max(0, int(seconds))
    parts: list[str] = []
    for key, size in DURATION_UNITS:
        count, remaining = divmod(remaining, size)
        if count or parts:
            parts.append(f"{count} {text(key, lang)}")
        if len(parts) == 2:
            break
    if not parts:
        return f"0 {text('unit_s', lang)}"
    if len(parts) == 2 and parts[1].startswith("0 "):
        parts.pop()  # "2 h" rather than "2 h 0 min"
    return " ".join(parts)


class Code(str):
    """A cell shown as code (a key's prefix): set in backticks, not escaped."""


def _cell(value: Any) -> str:
    """A table cell's Markdown. Names come from users (a key's name, a voice's consent by): their HTML
    and Markdown are shown as written, never rendered (an `<img>` in a key's name loaded in every admin's
    browser)."""
    if value in (None, ""):
        return "-"
    if isinstance(value, Code):
        code = value.replace("`", "'")
        return f"`{code}`"
    return as_written(value)


def _table(head: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table in a box that scrolls sideways on a narrow screen and takes the keyboard's focus
    (a keyboard reached none of the columns the box hid). (Gradio's sanitizer drops an `aria-label`.)"""
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    box = '<div class="cosy-scroll" tabindex="0">'
    return box + "\n\n" + "\n".join(lines) + "\n\n</div>"


def gpu_markdown(memory: dict[str, Any], lang: str) -> str:
    """One row per GPU (name, busy, memory used/free/total, temperature), or why there is none."""
    gpus = memory.get("gpus") or []
    if not gpus:
        reason = memory.get("gpu_absent_reason") or "-"
        return text("gpu_none", lang, reason=reason)
    rows = []
    for gpu in gpus:
        util = gpu.get("utilization")
        temp = gpu.get("temperature_c")
        rows.append(
            [
                gpu["index"],
                gpu["name"],
                f"{util * 100:.0f}%" if util is not None else "-",
                f"{gpu['memory_used_bytes'] / 2**30:.1f} GiB",
                f"{gpu['memory_free_bytes'] / 2**30:.1f} GiB",
                f"{gpu['memory_total_bytes'] / 2**30:.1f} GiB",
                f"{temp:.0f} °C" if temp is not None else "-",
            ]
        )
    table = _table(text("gpu_cols", lang).split("|"), rows)
    allocator = memory.get("engine_allocator")
    if allocator:
        table += "\n\n" + text("engine_allocator", lang, device=memory.get("device"), **allocator)
    return table


def status_markdown(status: dict[str, Any], lang: str) -> str:
    """Engine, model, device, memory, queue and storage as a two-column table."""
    ready, queue, memory = status["readiness"], status["scheduler"], status["memory"]
    state = f"{ready.get('state')}" + ("" if ready.get("ready") else f" — {ready.get('reason')}")
    model = f"{ready.get('model_path') or ready.get('model')}" + (" (demo)" if ready.get("demo") else "")
    finished = ", ".join(f"{k} {v}" for k, v in queue.get("finished", {}).items())
    outputs = status["outputs"]
    rows = [
        ("adm_state", state),
        ("adm_model", model),
        ("adm_device", ready.get("device")),
        ("adm_process_memory", f"{memory.get('process_rss_mb')} MB"),
        (
            "adm_queue",
            text(
                "adm_queue_value",
                lang,
                queued=queue["queued"],
                size=queue["queue_size"],
                running=queue["running"],
                slots=queue["concurrency"],
            ),
        ),
        ("adm_finished", finished or "-"),
        ("adm_mean", f"{queue.get('mean_duration_s') or '-'} s"),
        ("adm_outputs", f"{outputs['total_bytes'] / 1e6:.1f} MB · {outputs['root']}"),
        ("adm_uptime", human_duration(status["uptime_s"], lang)),
    ]
    head = text("adm_cols", lang).split("|")
    return _table(head, [[text(key, lang), value] for key, value in rows])


ACTIVITY_FIELDS = ("event", "result", "who", "mode", "chars", "audio_s", "rtf", "device")


def activity_markdown(entries: list[dict[str, Any]], lang: str) -> str:
    """The newest activity lines (syntheses, jobs, enrolments, restarts, logins), newest first."""
    lines = [e for e in entries if e.get("logger") == "cosyserve.activity"][-ACTIVITY_ROWS:]
    if not lines:
        return text("activity_none", lang)
    rows = [
        [str(e.get("ts", ""))[11:19], *(e.get(name) for name in ACTIVITY_FIELDS), e.get("request_id")]
        for e in reversed(lines)
    ]
    return _table(text("activity_cols", lang).split("|"), rows)


def _quota_cell(limit_s: float | None, lang: str) -> str:
    return text("keys_unlimited", lang) if limit_s is None else f"{limit_s:g} s"


def keys_markdown(views: list[dict[str, Any]], lang: str) -> str:
    """The API keys (`key_admin.key_view`) with today's usage and the seconds reserved by running work."""
    if not views:
        return text("keys_none", lang)
    rows = []
    for view in views:
        usage = view["usage_today"]
        state = text("key_active", lang) if view["active"] else text("key_revoked", lang)
        rows.append(
            [
                view["id"],
                view["name"],
                Code(f"{view['prefix']}…"),
                view["role"],
                state,
                f"{usage['used_s']:g} s",
                f"{usage['reserved_s']:g} s",
                _quota_cell(usage["limit_s"], lang),
                _date(view.get("last_used_at")),
            ]
        )
    return _table(text("keys_cols", lang).split("|"), rows)


def enrolments_markdown(voices: list[Any], lang: str, key_names: dict[str, str] | None = None) -> str:
    """Who enrolled each voice: its owner (`key:<id>` with the key's name from `key_names`), who confirmed
    consent and when, whether it is shared."""
    if not voices:
        return text("enrolments_none", lang)
    rows = []
    for voice in voices:
        consent = voice.consent or {}
        rows.append(
            [
                voice.name,
                _owner(voice.owner, key_names or {}, lang),
                consent.get("by") or text("consent_missing", lang),
                _date(consent.get("at")),
                text("yes", lang) if voice.shared else text("no", lang),
            ]
        )
    return _table(text("enrolments_cols", lang).split("|"), rows)


def _owner(owner: str | None, key_names: dict[str, str], lang: str) -> str:
    if owner is None:
        return text("owner_nobody", lang)
    return f"{key_names[owner]} ({owner})" if owner in key_names else owner


def _date(unix: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(unix)) + " UTC" if unix else "-"
