"""The web UI at `/`: `build_ui(service)` makes the Gradio page, `mount_ui(app, service)` serves it.

Security by construction:
- the page, its uploads, files and event API all sit behind `auth_dependency`, which resolves the same
  credentials as the REST API (the API's session cookie from /login, an API key, or nobody when the
  server has no authentication configured at all);
- Gradio serves no directory of ours (`allowed_paths` is empty and the data dir is blocked): results are
  shown from copies in Gradio's cache and downloaded through the output store's signed links;
- uploads are capped at `max_upload_mb` by Gradio, and the UI accepts only audio suffixes and decodable
  audio (checked again by the service);
- fonts are the system's (no request to an outside font host), and there is no footer, API page, MCP
  server, run history or SSR process;
- only the origins in `cors_origins` get CORS answers (`api/cors.py` removes those Gradio gives any
  origin), and a login is a server-side session whose cookie holds no key (`ui/login.py`).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import gradio as gr
from fastapi import FastAPI
from fastapi.routing import APIRoute
from gradio import utils as gradio_utils

from cosyserve.ui import assets
from cosyserve.ui.admin_tab import build_admin_tab
from cosyserve.ui.batch_tab import build_batch_tab
from cosyserve.ui.bridge import MODES, Principal, Service, UiBridge
from cosyserve.ui.event_cap import cap_waiting_events
from cosyserve.ui.file_owners import UploadOwnerRecorder
from cosyserve.ui.generate import TicketRegistry
from cosyserve.ui.history_tab import HistoryTab, build_history_tab
from cosyserve.ui.history_table import phone_css
from cosyserve.ui.i18n import LANG_CHOICES, Translator, pick_lang, text
from cosyserve.ui.library_tab import build_library_tab, refresh_values
from cosyserve.ui.login import LOGIN_PATH, LOGOUT_PATH, install_login_routes, ui_auth_dependency
from cosyserve.ui.studio import UiContext, build_mode_panel
from cosyserve.ui.studio_events import wire_panel
from cosyserve.ui.upload_leftovers import start_sweeping

STATUS_POLL_S = 3.0
LANG_STORAGE_KEY = "cosyserve-lang"


def header_html(lang: str) -> str:
    return f"<h1>{html.escape(text('title', lang))}</h1><p>{html.escape(text('subtitle', lang))}</p>"


def user_html(principal: Principal | None, lang: str, auth_enabled: bool) -> str:
    if principal is None or principal.kind == "anonymous" or not auth_enabled:
        return f"<span>{html.escape(text('anonymous', lang))}</span>"
    name = html.escape(principal.name or principal.kind)
    logout = f'<a href="{LOGOUT_PATH}" id="cosy-logout">{text("logout", lang)}</a>'
    return (
        f"<span{session_watch_attrs(principal, lang)}>{text('signed_in', lang, name=name)}</span> · {logout}"
    )


def session_watch_attrs(principal: Principal, lang: str) -> str:
    """The attributes by which the page's session watch (`assets.SESSION_WATCH`) knows whom the page was
    made for (`data-who`: the owner `/v1/me` reports) and what to say, in the page's language, when the
    browser's sign-in has ended or is now someone else's."""
    if principal.owner is None:
        return ""
    values = {
        "who": principal.owner,
        "login": LOGIN_PATH,
        "ended": text("session_ended", lang),
        "sign-in": text("session_sign_in", lang),
        "switched": text("session_switched", lang, name="{name}"),
        "reload": text("session_reload", lang),
        "signed-in": text("signed_in", lang, name="{name}"),
        "signed-out": text("signed_out", lang),
    }
    return "".join(f' data-{key}="{html.escape(value, quote=True)}"' for key, value in values.items())


def model_status(bridge: UiBridge, lang: str) -> tuple[str, str, bool]:
    """(banner HTML, status line, ready?) for the model as it is now."""
    info = bridge.readiness()
    state = info.get("state")
    banner = ""
    if info.get("demo"):
        banner = f'<div class="demo" id="cosy-demo-banner">⚠ {html.escape(text("demo_banner", lang))}</div>'
    if info.get("ready"):
        model = str(info.get("model_path") or info.get("model") or "").rstrip("/").rsplit("/", 1)[-1]
        status = text("model_ready", lang, model=model, device=info.get("device"))
    elif state == "failed":
        status = "✗ " + text("model_failed", lang, reason=info.get("reason"))
    elif state == "restarting":
        status = "… " + text("model_restarting", lang)
    else:
        status = "… " + text("model_loading", lang)
    return banner, status, bool(info.get("ready"))


def build_ui(service: Service, bridge: UiBridge | None = None) -> gr.Blocks:
    """The whole page for `service` (not yet served: see `mount_ui`)."""
    bridge = bridge or UiBridge(service)
    tr = Translator()
    registry = TicketRegistry()
    slots = bridge.event_slots
    with gr.Blocks(title=text("title", "en"), analytics_enabled=False, delete_cache=(3600, 86400)) as demo:
        lang = gr.State(tr.lang)
        saved_lang = gr.BrowserState(None, storage_key=LANG_STORAGE_KEY)
        with gr.Row(equal_height=True):
            with gr.Column(scale=8):
                tr.bind(gr.HTML(header_html(tr.lang), elem_id="cosy-header"), value=header_html)
            with gr.Column(scale=3, min_width=220):
                lang_radio = gr.Radio(  # its hidden label: both languages, for a reader who knows one
                    LANG_CHOICES,
                    value=tr.lang,
                    label="语言 / Language",
                    show_label=False,
                    elem_id="cosy-lang",
                )
                user = gr.HTML("", elem_id="cosy-user")
        banner = gr.HTML("", elem_id="cosy-banner")
        status = gr.Markdown("", elem_id="cosy-status")
        ctx = UiContext(bridge, tr, registry, lang, gr.utils.get_upload_folder(), slots)
        with gr.Tabs(elem_id="cosy-tabs") as tabs:
            panels = [build_mode_panel(mode, ctx) for mode in MODES]
            for panel in panels:
                wire_panel(panel, ctx)
            library = build_library_tab(ctx, panels, tabs)
            build_batch_tab(ctx)
            # (the admin tab is not the last one: Gradio 6.31 duplicates the button of a last tab when
            # that tab is first opened)
            admin = build_admin_tab(ctx)
            history = build_history_tab(ctx, panels, tabs)
        timer = gr.Timer(STATUS_POLL_S)

        actions = _PageActions(bridge, ctx, history)
        # (the language state is set here too, not only by the radio's change event: the status timer
        # reads it and would otherwise repaint the banner in the default language meanwhile)
        page_lang = assets.page_lang_js(text("title", "zh"), text("title", "en"))
        demo.load(actions.on_load, [saved_lang], [lang, lang_radio, user, admin.tab, banner, status]).then(
            None,
            [lang_radio],
            None,
            js=page_lang,  # (the radio's change does not fire when it keeps its value)
        )
        # Voices are the caller's: the page's config carries none, each visitor's load fills its own.
        demo.load(actions.voices, [saved_lang], library.refresh_outputs(panels), api_name="page_voices")
        demo.load(history.refresh, [lang], history.refresh_outputs)
        lang_radio.change(
            actions.switch,
            [lang_radio],
            [
                lang,
                saved_lang,
                user,
                banner,
                status,
                *tr.components,
                *library.refresh_outputs(panels),
                *history.refresh_outputs,
            ],
        )
        # the document's language and title follow the page's (a screen reader picks its voice by `lang`)
        # (on the radio: a State's change runs no browser-only function; the radio's fires on load too)
        lang_radio.change(None, [lang_radio], None, js=page_lang)
        timer.tick(  # (passive: `ui.login.PASSIVE_EVENTS`)
            actions.tick,
            [lang],
            [banner, status],
            queue=False,
            show_progress="hidden",
            api_name="status_tick",
        )
        history.tab.select(history.refresh, [lang], history.refresh_outputs)
        for panel in panels:  # a new result appears in the history without a manual refresh
            panel.run_event.then(history.refresh, [lang], history.refresh_outputs, show_progress="hidden")
    return demo


class _PageActions:
    """The page's own event handlers: first load, language switch, status ticks."""

    def __init__(self, bridge: UiBridge, ctx: UiContext, history: HistoryTab) -> None:
        self.bridge, self.ctx, self.history = bridge, ctx, history

    def principal_or_none(self, request: gr.Request) -> Principal | None:
        try:
            return self.bridge.principal_of(request)
        except Exception:
            return None

    def on_load(self, saved: str | None, request: gr.Request) -> list[Any]:
        headers = dict(getattr(request, "headers", None) or {})
        chosen = pick_lang(saved, headers.get("accept-language"))
        principal = self.principal_or_none(request)
        banner_html, status_md, _ = model_status(self.bridge, chosen)
        is_admin = principal is not None and principal.is_admin
        return [
            chosen,
            chosen,
            user_html(principal, chosen, self.bridge.auth_enabled()),
            gr.update(visible=True) if is_admin else gr.update(),  # its calls check the role too
            banner_html,
            status_md,
        ]

    def voices(self, saved: str | None, request: gr.Request) -> list[Any]:
        headers = dict(getattr(request, "headers", None) or {})
        chosen = pick_lang(saved, headers.get("accept-language"))
        return refresh_values(self.ctx, chosen, self.principal_or_none(request))

    def switch(self, chosen: str, request: gr.Request) -> list[Any]:
        principal = self.principal_or_none(request)
        return [
            chosen,
            chosen,
            user_html(principal, chosen, self.bridge.auth_enabled()),
            *model_status(self.bridge, chosen)[:2],
            *self.ctx.tr.updates(chosen),
            *refresh_values(self.ctx, chosen, principal),
            *self.history.refresh(chosen, request),
        ]

    def tick(self, chosen: str) -> list[Any]:
        banner_html, status_md, _ = model_status(self.bridge, chosen)
        return [banner_html, status_md]


def mount_ui(app: FastAPI, service: Service, path: str = "/") -> gr.Blocks:
    """Serve the UI at `path` of `app` (created by `create_app`), behind the API's authentication.

    Adds /login and /logout, and replaces the API's placeholder `GET /` (a redirect to /docs) when the
    UI takes the root. Call it once, after all API routes were added.
    """
    bridge = UiBridge(service)
    demo = build_ui(service, bridge)
    mount_path = "/" + path.strip("/") if path.strip("/") else "/"
    if mount_path == "/":
        app.router.routes[:] = [
            route
            for route in app.router.routes
            if not (isinstance(route, APIRoute) and route.path == "/" and "GET" in route.methods)
        ]
    install_login_routes(app, bridge)
    theme = gr.themes.Soft(
        primary_hue="indigo",
        font=["system-ui", "-apple-system", "PingFang SC", "Microsoft YaHei", "sans-serif"],
        font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "monospace"],
    ).set(  # WCAG AA contrast: Soft's indigo-500 labels on indigo-100 were 3.6:1, its grey info text 2.5:1
        block_label_text_color="*primary_700",
        block_title_text_color="*primary_700",
        block_info_text_color="*neutral_600",
        body_text_color_subdued="*neutral_600",
        input_placeholder_color="*neutral_500",
        color_accent="*primary_600",
        button_primary_background_fill="*primary_600",
        button_primary_background_fill_hover="*primary_700",
        checkbox_label_background_fill_selected="*primary_600",
    )
    gr.mount_gradio_app(
        app,
        demo,
        path=mount_path,
        auth_dependency=ui_auth_dependency(bridge),
        allowed_paths=[],
        blocked_paths=bridge.private_folders,
        max_file_size=bridge.max_upload_bytes,
        show_error=True,
        footer_links=[],
        run_history=False,
        ssr_mode=False,
        mcp_server=False,
        enable_monitoring=False,  # its /monitoring/summary told any signed-in user everyone's event counts
        pwa=False,
        theme=theme,
        css=assets.CSS + phone_css(),
        head=assets.head_html(),
    )
    cap_waiting_events(demo)
    app.add_middleware(UploadOwnerRecorder)
    start_sweeping(Path(gradio_utils.get_upload_folder()))  # what hung-up uploads leave there
    return demo
