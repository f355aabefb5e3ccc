"""The admin tab (admin principals only): engine status, device and memory, queue, restart, recent logs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from cosyserve.ui.generate import as_gr_error
from cosyserve.ui.i18n import text
from cosyserve.ui.studio import UiContext

LOG_LINES = 200
LOG_SCAN = 1000  # entries read before the page's own access lines are filtered out
LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


def status_markdown(status: dict[str, Any], lang: str) -> str:
    """A readable summary of `UiBridge.status()`."""
    ready, queue, memory = status["readiness"], status["scheduler"], status["memory"]
    zh = lang == "zh"
    rows = [
        (
            "状态" if zh else "State",
            f"{ready.get('state')}" + ("" if ready.get("ready") else f" — {ready.get('reason')}"),
        ),
        (
            "模型" if zh else "Model",
            f"{ready.get('model_path') or ready.get('model')}" + (" (demo)" if ready.get("demo") else ""),
        ),
        ("设备" if zh else "Device", str(ready.get("device"))),
        ("进程内存" if zh else "Process memory", f"{memory.get('process_rss_mb')} MB"),
    ]
    if "cuda_total_mb" in memory:
        rows.append(
            (
                "显存" if zh else "GPU memory",
                f"{memory['cuda_allocated_mb']} MB allocated, {memory['cuda_reserved_mb']} MB reserved, "
                f"{memory['cuda_free_mb']} / {memory['cuda_total_mb']} MB free",
            )
        )
    finished = ", ".join(f"{k} {v}" for k, v in queue.get("finished", {}).items())
    rows += [
        (
            "队列" if zh else "Queue",
            f"{queue['queued']} / {queue['queue_size']} waiting, "
            f"{queue['running']} / {queue['concurrency']} running",
        ),
        ("已完成" if zh else "Finished", finished or "-"),
        ("平均耗时" if zh else "Mean duration", f"{queue.get('mean_duration_s') or '-'} s"),
        (
            "输出存储" if zh else "Output store",
            f"{status['outputs']['total_bytes'] / 1e6:.1f} MB in {status['outputs']['root']}",
        ),
        ("运行时间" if zh else "Uptime", f"{status['uptime_s']:.0f} s"),
    ]
    head = ("项目", "值") if zh else ("Item", "Value")
    body = "\n".join(f"| {name} | {value} |" for name, value in rows)
    return f"| {head[0]} | {head[1]} |\n| --- | --- |\n{body}"


# Access-log lines of the page's own plumbing (assets, Gradio's event API) would bury everything else.
UI_PLUMBING = ("/assets/", "/gradio_api/", "/static/", "/theme.css", "/config", "/favicon", "/manifest.json")


def logs_text(entries: list[dict[str, Any]]) -> str:
    lines = []
    for entry in entries:
        message = str(entry.get("message", ""))
        if entry.get("logger") == "cosyserve.access" and any(f" {p}" in message for p in UI_PLUMBING):
            continue
        where = f"[{entry.get('request_id', '-')}] {entry.get('logger', '')}"
        lines.append(f"{entry.get('ts', '')} {entry.get('level', ''):7} {where}: {message}")
    return "\n".join(lines[-LOG_LINES:])


@dataclass
class AdminTab:
    tab: Any
    status: gr.Markdown
    logs: gr.Textbox
    level: gr.Dropdown


def build_admin_tab(ctx: UiContext) -> AdminTab:
    tr, bridge = ctx.tr, ctx.bridge
    with tr.bind(
        gr.Tab(tr("tab_admin"), id="admin", visible=False, elem_id="tab-admin"), label="tab_admin"
    ) as tab:
        tr.bind(
            gr.Markdown(f"### {tr('engine_status')}"), value=lambda lang: f"### {text('engine_status', lang)}"
        )
        status = gr.Markdown("", elem_id="admin-status")
        with gr.Row():
            refresh = tr.bind(gr.Button(tr("refresh"), elem_id="admin-refresh"), value="refresh")
            restart = tr.bind(
                gr.Button(tr("restart_engine"), variant="stop", elem_id="admin-restart"),
                value="restart_engine",
            )
        message = gr.Markdown("", elem_id="admin-message")
        level = tr.bind(
            gr.Dropdown(LEVELS, value="INFO", label=tr("log_level"), elem_id="admin-level"), label="log_level"
        )
        logs = tr.bind(
            gr.Textbox(
                "",
                label=tr("logs"),
                lines=18,
                max_lines=30,
                interactive=False,
                elem_id="admin-logs",
                elem_classes="cosy-logs",
            ),
            label="logs",
        )
    admin = AdminTab(tab, status, logs, level)

    def do_refresh(lang: str, log_level: str, request: gr.Request) -> tuple[str, str]:
        try:
            principal = bridge.principal_of(request)
            entries = bridge.logs(principal, LOG_SCAN, log_level)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        return status_markdown(bridge.status(), lang), logs_text(entries)

    def do_restart(lang: str, request: gr.Request) -> str:
        try:
            bridge.restart_engine(bridge.principal_of(request))
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        return text("restarting", lang)

    outputs = [status, logs]
    refresh.click(do_refresh, [ctx.lang, level], outputs)
    level.change(do_refresh, [ctx.lang, level], outputs)
    tab.select(do_refresh, [ctx.lang, level], outputs)
    restart.click(do_restart, [ctx.lang], [message]).then(do_refresh, [ctx.lang, level], outputs)
    return admin
