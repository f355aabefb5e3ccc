"""What the admin tab shows, as Markdown: engine and queue, the GPUs (NVML), and recent activity.

The figures come from `UiBridge.status()` and the activity log lines (`service.activity`), so the tab
answers what ran, for whom, how fast, on which GPU and with how much memory free.
"""

from __future__ import annotations

from typing import Any

from cosyserve.ui.i18n import text

ACTIVITY_ROWS = 15


def _cell(value: Any) -> str:
    return str(value).replace("|", "/").replace("\n", " ") if value not in (None, "") else "-"


def _table(head: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


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
        ("adm_uptime", f"{status['uptime_s']:.0f} s"),
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
