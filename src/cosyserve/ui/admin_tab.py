"""The admin tab (admin principals only): engine status (followed through a restart), GPUs, API keys and
quotas, enrolments, recent activity, restart, recent logs (as plain text: no terminal colour codes)."""

from __future__ import annotations

import html
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from cosyserve.ui import assets
from cosyserve.ui.admin_keys import build_keys_section
from cosyserve.ui.admin_status import activity_markdown, gpu_markdown, status_markdown, strip_ansi
from cosyserve.ui.bridge import one_line
from cosyserve.ui.generate import as_gr_error
from cosyserve.ui.i18n import text
from cosyserve.ui.optional_parts import parts_note
from cosyserve.ui.studio import UiContext

LOG_LINES = 200
LOG_SCAN = 1000  # entries read before the page's own access lines are filtered out
LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]
UNSETTLED = ("loading", "restarting")  # engine states a restart passes through
RESTART_POLL_S = 1.0
RESTART_WATCH_S = 600.0  # how long the panel follows a reload before leaving it to the refresh button

# Access-log lines of the page's own plumbing (assets, Gradio's event API) would bury everything else.
UI_PLUMBING = ("/assets/", "/gradio_api/", "/static/", "/theme.css", "/config", "/favicon", "/manifest.json")


def logs_text(entries: list[dict[str, Any]]) -> str:
    lines = []
    for entry in entries:
        message = one_line(strip_ansi(str(entry.get("message", ""))))  # colours dropped, other controls shown
        if entry.get("logger") == "cosyserve.access" and any(f" {p}" in message for p in UI_PLUMBING):
            continue
        where = f"[{entry.get('request_id', '-')}] {entry.get('logger', '')}"
        extras = " ".join(
            f"{k}={one_line(strip_ansi(str(v)))}"
            for k, v in entry.items()
            if k not in ("ts", "level", "logger", "message", "request_id", "exc") and v is not None
        )
        line = f"{entry.get('ts', '')} {entry.get('level', ''):7} {where}: {message} {extras}".rstrip()
        lines.append(line)
    return "\n".join(lines[-LOG_LINES:])


@dataclass
class AdminTab:
    tab: Any
    status: gr.Markdown
    logs: gr.HTML
    level: gr.Dropdown


def _heading(tr: Any, key: str) -> None:
    tr.bind(gr.Markdown(f"## {tr(key)}"), value=lambda lang: f"## {text(key, lang)}")


def _activity_and_logs(tr: Any) -> tuple[Any, Any, Any]:
    """The activity table (full width: ten columns of figures), the log level picker and the log lines."""
    _heading(tr, "activity_title")
    activity = gr.Markdown("", elem_id="admin-activity", elem_classes="cosy-table")
    level = tr.bind(
        gr.Dropdown(LEVELS, value="INFO", label=tr("log_level"), elem_id="admin-level"), label="log_level"
    )
    # (a read-only Textbox is a *disabled* textarea: no keyboard focus, so its scrolled lines were out of
    # a keyboard's reach; a focusable, labelled <pre> scrolls with the arrow keys)
    _heading(tr, "logs")
    logs = gr.HTML("", elem_id="admin-logs", elem_classes="cosy-logs")
    return activity, level, logs


def logs_html(entries: list[dict[str, Any]], lang: str) -> str:
    """The log lines in a focusable region (scrolled with the keyboard), named for screen readers."""
    label = html.escape(text("logs", lang), quote=True)
    body = html.escape(logs_text(entries))
    return f'<pre class="cosy-logs-pre" tabindex="0" role="region" aria-label="{label}">{body}</pre>'


def build_admin_tab(ctx: UiContext) -> AdminTab:
    tr, bridge = ctx.tr, ctx.bridge
    with tr.bind(
        gr.Tab(tr("tab_admin"), id="admin", visible=False, elem_id="tab-admin"), label="tab_admin"
    ) as tab:
        with gr.Row(equal_height=False):
            with gr.Column(scale=5, min_width=320):
                _heading(tr, "engine_status")
                status = gr.Markdown("", elem_id="admin-status")
                with gr.Row():
                    refresh = tr.bind(gr.Button(tr("refresh"), elem_id="admin-refresh"), value="refresh")
                    restart = tr.bind(
                        gr.Button(tr("restart_engine"), variant="stop", elem_id="admin-restart"),
                        value="restart_engine",
                    )
                with gr.Row(visible=False, elem_id="admin-confirm-row") as confirm_row:
                    confirm = tr.bind(
                        gr.Button(tr("confirm_restart"), variant="stop", elem_id="admin-confirm"),
                        value="confirm_restart",
                    )
                    keep = tr.bind(gr.Button(tr("keep_running"), elem_id="admin-keep"), value="keep_running")
                message = gr.Markdown("", elem_id="admin-message")
                parts_note(tr, list(bridge.optional_parts().values()), "admin-parts")
            with gr.Column(scale=6, min_width=320):
                _heading(tr, "gpu_title")
                gpus = gr.Markdown("", elem_id="admin-gpus", elem_classes="cosy-table")
        keys = build_keys_section(ctx)
        activity, level, logs = _activity_and_logs(tr)
    admin = AdminTab(tab, status, logs, level)

    def do_refresh(lang: str, log_level: str, request: gr.Request) -> tuple[str, str, str, str]:
        try:
            principal = bridge.principal_of(request)
            entries = bridge.logs(principal, LOG_SCAN, log_level)
            activity_entries = bridge.activity(principal, LOG_SCAN)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        state = bridge.status()
        return (
            status_markdown(state, lang),
            gpu_markdown(state["memory"], lang),
            activity_markdown(activity_entries, lang),
            logs_html(entries, lang),
        )

    def follow_restart(lang: str, log_level: str, request: gr.Request) -> Iterator[tuple[str, ...]]:
        """The panel after a restart: refreshed every second until the engine is ready (or failed)."""
        deadline = time.monotonic() + RESTART_WATCH_S
        while True:
            values = do_refresh(lang, log_level, request)
            state = bridge.status()["readiness"].get("state")
            if state not in UNSETTLED or time.monotonic() > deadline:
                yield (*values, text("restart_settled", lang, state=state))
                return
            yield (*values, text("restarting", lang))
            time.sleep(RESTART_POLL_S)

    def ask_restart(lang: str) -> tuple[Any, str]:
        return gr.update(visible=True), text("restart_question", lang)

    def do_restart(lang: str, request: gr.Request) -> tuple[Any, str]:
        try:
            bridge.restart_engine(bridge.principal_of(request))
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        return gr.update(visible=False), text("restarting", lang)

    outputs = [status, gpus, activity, logs]
    refresh.click(do_refresh, [ctx.lang, level], outputs)
    level.change(do_refresh, [ctx.lang, level], outputs)
    tab.select(do_refresh, [ctx.lang, level], outputs)
    refresh.click(keys.refresh, [ctx.lang], keys.outputs)
    tab.select(keys.refresh, [ctx.lang], keys.outputs)
    restart.click(ask_restart, [ctx.lang], [confirm_row, message])
    refocus = assets.focus_js("admin-restart")  # the row of the focused button goes: not to the top
    keep.click(lambda: (gr.update(visible=False), ""), None, [confirm_row, message]).then(None, js=refocus)
    restarting = confirm.click(do_restart, [ctx.lang], [confirm_row, message])
    restarting.then(None, js=refocus)
    restarting.then(follow_restart, [ctx.lang, level], [*outputs, message])
    return admin
