"""The Batch tab: upload a script (CSV, TXT, JSONL) or a subtitle file (SRT, WebVTT), pick a voice, and
watch it run — a live progress bar and a table of every item — then play any finished item and download
the ZIP (a script) or the track and its timing report (subtitles).

The tab follows one batch at a time, polling its status once a second while it runs (`gr.Timer`); the
batch itself is a job on the server, so it goes on if the page is closed, and survives a restart. "Your
batches" lists the user's recent ones, so a reloaded page finds its way back to any of them (the newest
is opened when the tab opens if it is still running).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import gradio as gr

from cosyserve.ui import assets
from cosyserve.ui.batch_rows import bt, item_check, item_error, progress_html
from cosyserve.ui.bridge import (
    SCRIPT_SUFFIXES,
    SUBTITLE_SUFFIXES,
    BatchBridge,
    BatchStatus,
    Principal,
    new_request_id,
)
from cosyserve.ui.generate import as_gr_error, cache_copy
from cosyserve.ui.i18n import text
from cosyserve.ui.local_times import local_text
from cosyserve.ui.studio import UiContext

POLL_S = 1.0


def _in(key: str) -> Any:
    return lambda lang: bt(key, lang)


def _columns(lang: str) -> list[str]:
    return bt("cols", lang).split("|")


@dataclass
class BatchTab:
    tab: Any
    voice: gr.Dropdown


@dataclass
class _Parts:
    """The tab's components, for the event handlers."""

    progress: gr.HTML
    links: gr.HTML
    table: gr.Dataframe
    pick: gr.Dropdown
    audio: gr.Audio
    timer: gr.Timer
    current: gr.State
    recent: gr.Dropdown
    shown: gr.State  # `_mark` of the table the page shows (the tick resends it only when it changed)

    @property
    def view(self) -> list[Any]:
        return [self.progress, self.links, self.table, self.pick, self.timer, self.recent]


def build_batch_tab(ctx: UiContext) -> BatchTab:
    tr = ctx.tr
    with tr.bind(gr.Tab(tr_text(ctx, "tab"), id="batch", elem_id="tab-batch"), label=_in("tab")) as tab:
        tr.bind(gr.Markdown(tr_text(ctx, "about")), value=_in("about"))
        with gr.Row(equal_height=False):
            with gr.Column(scale=4):
                inputs = _inputs(ctx)
            with gr.Column(scale=6):
                parts = _outputs(ctx)
    actions = _BatchActions(ctx, BatchBridge(ctx.bridge), parts)
    file, voice, instruct, fmt, max_speed, takes, start, cancel = inputs
    start.click(
        actions.start,
        [ctx.lang, file, voice, instruct, fmt, max_speed, takes],
        [parts.current, *parts.view, parts.audio],
    )
    # the upload button that had the focus is replaced by the file's row: keep the focus in the form
    file.upload(None, None, None, js=assets.refocus_js("batch-file"))
    parts.timer.tick(  # (passive: `ui.login.PASSIVE_EVENTS`)
        actions.tick,
        [ctx.lang, parts.current, parts.shown],
        [*parts.view, parts.shown],
        show_progress="hidden",
        api_name="batch_tick",
    )
    cancel.click(actions.cancel, [ctx.lang, parts.current], parts.view)
    parts.pick.change(actions.play, [ctx.lang, parts.current, parts.pick], [parts.audio])
    parts.recent.input(actions.open, [ctx.lang, parts.recent], [parts.current, *parts.view, parts.audio])
    tab.select(actions.voices, [ctx.lang, voice], [voice])
    tab.select(
        actions.reopen, [ctx.lang, parts.current], [parts.current, *parts.view], show_progress="hidden"
    )
    ctx.lang.change(actions.refresh, [ctx.lang, parts.current], parts.view, show_progress="hidden")
    return BatchTab(tab, voice)


def _mark(lang: str, status: BatchStatus) -> str:
    """What the table shows: an item's row changes only as it moves between states, which the counts
    see (its duration, check and error are written as it finishes)."""
    counts, record = status.counts, status.record
    moved = (counts.queued, counts.running, counts.done, counts.failed, counts.cancelled)
    return f"{record.id}|{record.state}|{lang}|{moved}"


def tr_text(ctx: UiContext, key: str) -> str:
    return bt(key, ctx.tr.lang)


def _inputs(ctx: UiContext) -> tuple[Any, ...]:
    tr, lang = ctx.tr, ctx.tr.lang
    file = tr.bind(
        gr.File(
            label=bt("file", lang),
            file_types=list(SCRIPT_SUFFIXES + SUBTITLE_SUFFIXES),
            type="filepath",
            elem_id="batch-file",
        ),
        label=_in("file"),
    )
    voice = tr.bind(  # its choices are the caller's, set when the tab opens (the page config names none)
        gr.Dropdown(choices=[], value=None, label=bt("voice", lang), elem_id="batch-voice"),
        label=_in("voice"),
    )
    instruct = tr.bind(
        gr.Textbox(label=bt("instruct", lang), max_lines=1, elem_id="batch-instruct"), label=_in("instruct")
    )
    fmt = tr.bind(
        gr.Radio(["wav", "mp3", "flac"], value="wav", label=bt("format", lang), elem_id="batch-format"),
        label=_in("format"),
    )
    max_speed = tr.bind(
        gr.Slider(1.0, 2.0, value=1.25, step=0.05, label=bt("max_speed", lang), elem_id="batch-max-speed"),
        label=_in("max_speed"),
    )
    bridge = ctx.bridge
    takes = tr.bind(  # starts at the server's default; an item's own `takes` column wins
        gr.Slider(
            1,
            bridge.max_takes,
            value=bridge.default_takes,
            step=1,
            label=bt("takes", lang),
            elem_id="batch-takes",
        ),
        label=_in("takes"),
    )
    with gr.Row():
        start = tr.bind(
            gr.Button(bt("start", lang), variant="primary", elem_id="batch-start"), value=_in("start")
        )
        cancel = tr.bind(
            gr.Button(bt("cancel", lang), variant="stop", elem_id="batch-cancel"), value=_in("cancel")
        )
    return file, voice, instruct, fmt, max_speed, takes, start, cancel


def _outputs(ctx: UiContext) -> _Parts:
    tr, lang = ctx.tr, ctx.tr.lang
    recent = tr.bind(  # the caller's own, filled when the tab opens
        gr.Dropdown(choices=[], value=None, label=bt("recent", lang), elem_id="batch-recent"),
        label=_in("recent"),
    )
    progress = gr.HTML("", elem_id="batch-progress")
    links = gr.HTML("", elem_id="batch-links")
    table = tr.bind(  # headed before any batch is shown too (it read "1 | 2 | 3")
        gr.Dataframe(headers=_columns(lang), interactive=False, wrap=True, elem_id="batch-table"),
        headers=_columns,
    )
    pick = tr.bind(
        gr.Dropdown(choices=[], value=None, label=bt("pick", lang), elem_id="batch-pick"), label=_in("pick")
    )
    audio = tr.bind(
        gr.Audio(type="filepath", interactive=False, label=bt("audio", lang), elem_id="batch-audio"),
        label=_in("audio"),
    )
    timer = gr.Timer(POLL_S, active=False)
    return _Parts(progress, links, table, pick, audio, timer, gr.State(None), recent, gr.State(None))


class _BatchActions:
    """The tab's event handlers; every one resolves the caller again from the request's credentials."""

    def __init__(self, ctx: UiContext, batches: BatchBridge, parts: _Parts) -> None:
        self.ctx, self.batches, self.parts = ctx, batches, parts

    def _principal(self, request: gr.Request) -> Principal:
        return self.ctx.bridge.principal_of(request)

    def start(
        self,
        lang: str,
        path: str | None,
        voice: str | None,
        instruct: str,
        fmt: str,
        max_speed: float,
        takes: float | None,
        request: gr.Request,
    ) -> list[Any]:
        if not path:
            raise gr.Error(bt("no_file", lang), title=text("error_title", lang), print_exception=False)
        if not voice:
            raise gr.Error(bt("no_voice", lang), title=text("error_title", lang), print_exception=False)
        request_id = new_request_id()
        try:
            principal = self._principal(request)
            record = self.batches.submit(
                principal,
                path,
                voice=voice,
                instruct=instruct,
                fmt=fmt,
                max_speed=max_speed,
                takes=None if takes is None else int(takes),
                request_id=request_id,
            )
            view = self._view(lang, principal, record.id)
        except Exception as exc:
            raise as_gr_error(exc, lang, request_id) from None
        view[3] = gr.update(choices=[], value=None)  # a new batch: nothing of it to play yet
        return [record.id, *view, None]

    def tick(self, lang: str, batch_id: str | None, shown: str | None, request: gr.Request) -> list[Any]:
        """The running batch's view, once a second, and the mark of its table; "Your batches" only when it
        has ended (redrawing the list every second would close it under a user choosing from it). The
        table and the finished items are read and sent only when an item has moved since the last tick:
        a 1000-item batch otherwise cost each watching page a full read and ~60 kB a second."""
        if not batch_id:
            return [*self.refresh(lang, batch_id, request), None]
        try:
            principal = self._principal(request)
            status = self.batches.status(principal, batch_id)
            mark = _mark(lang, status)
            if mark == shown and not status.record.is_terminal:
                unchanged = [gr.update(), gr.update(), gr.Timer(active=True), gr.update()]
                return [progress_html(status, lang), self._links(status, lang), *unchanged, mark]
            return [*self._view(lang, principal, batch_id, list_while_running=False, status=status), mark]
        except Exception as exc:
            raise as_gr_error(exc, lang) from None

    def refresh(self, lang: str, batch_id: str | None, request: gr.Request) -> list[Any]:
        if not batch_id:  # the empty table headed in `lang` (a headers-only update leaves it as it was)
            table = gr.update(value={"headers": _columns(lang), "data": []})
            return [gr.update(), gr.update(), table, gr.update(), gr.Timer(active=False), gr.update()]
        try:
            return self._view(lang, self._principal(request), batch_id)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None

    def open(self, lang: str, batch_id: str | None, request: gr.Request) -> list[Any]:
        """The batch picked in "Your batches": its view, followed while it runs; nothing of it played yet."""
        if not batch_id:
            return [None, *self.refresh(lang, None, request), None]
        try:
            view = self._view(lang, self._principal(request), batch_id)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        return [batch_id, *view, None]

    def reopen(self, lang: str, batch_id: str | None, request: gr.Request) -> list[Any]:
        """The tab opened: the list brought up to date, and the newest batch followed if the page follows
        none (after a reload) and it is still running."""
        try:
            principal = self._principal(request)
            if not batch_id:
                newest = self.batches.recent(principal, limit=1)
                batch_id = newest[0].id if newest and not newest[0].is_terminal else None
            if batch_id:
                return [batch_id, *self._view(lang, principal, batch_id)]
            empty = [gr.update(), gr.update(), gr.update(), gr.update(), gr.Timer(active=False)]
            return [None, *empty, self._recent(lang, principal, None)]
        except Exception as exc:
            raise as_gr_error(exc, lang) from None

    def cancel(self, lang: str, batch_id: str | None, request: gr.Request) -> list[Any]:
        if not batch_id:
            return self.refresh(lang, batch_id, request)
        try:
            principal = self._principal(request)
            if not self.batches.record(principal, batch_id).is_terminal:
                self.batches.cancel(principal, batch_id)
            return self._view(lang, principal, batch_id)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None

    def play(self, lang: str, batch_id: str | None, position: int | None, request: gr.Request) -> Any:
        if not batch_id or not position:
            return None
        try:
            principal = self._principal(request)
            output = self.batches.item_output(principal, batch_id, int(position))
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        return cache_copy(output.path, self.ctx.cache_dir, principal)

    def voices(self, lang: str, current: str | None, request: gr.Request) -> Any:
        try:
            principal = self._principal(request)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        choices = [(voice.name, voice.id) for voice in self.ctx.bridge.voices(principal)]
        ids = {value for _, value in choices}
        return gr.update(choices=choices, value=current if current in ids else None)

    def _view(
        self,
        lang: str,
        principal: Principal,
        batch_id: str,
        *,
        list_while_running: bool = True,
        status: BatchStatus | None = None,
    ) -> list[Any]:
        status = status or self.batches.status(principal, batch_id)
        items = self.batches.items(batch_id)
        headers = _columns(lang)
        rows = [
            [
                item.position,
                item.name,
                bt(f"state_{item.state}", lang),
                item.duration_s or "",
                item_check(item, lang),
                item_error(item, lang),
            ]
            for item in items
        ]
        finished = [
            (f"{item.position:04d} · {item.name}", item.position)
            for item in items
            if item.state == "done" and item.output_id  # not one whose file was deleted since
        ]
        return [
            progress_html(status, lang),
            self._links(status, lang),
            gr.update(value={"headers": headers, "data": rows}, headers=headers),
            gr.update(choices=finished),
            gr.Timer(active=not status.record.is_terminal),
            self._recent(lang, principal, batch_id)
            if list_while_running or status.record.is_terminal
            else gr.update(),
        ]

    def _recent(self, lang: str, principal: Principal, batch_id: str | None) -> Any:
        """ "Your batches", `batch_id` chosen: each labelled by when, what, how many items and its state."""
        choices = [
            (
                bt(
                    "recent_item",
                    lang,
                    when=local_text(record.created_at.timestamp(), self.ctx.bridge.time_zone, "%m-%d %H:%M"),
                    kind=bt(f"kind_{record.kind}", lang),
                    items=(record.params or {}).get("items", "?"),
                    state=bt(f"state_{record.state}", lang),
                ),
                record.id,
            )
            for record in self.batches.recent(principal)
        ]
        ids = {value for _, value in choices}
        if batch_id and batch_id not in ids:  # older than the list: still the one shown
            choices.insert(0, (batch_id, batch_id))
        return gr.update(choices=choices, value=batch_id)

    def _links(self, status: BatchStatus, lang: str) -> str:
        record, parts = status.record, []
        if status.counts.done:
            url = html.escape(self.batches.archive_url(record.id), quote=True)
            parts.append(
                f'<a class="cosy-download" id="batch-zip" href="{url}" download>⬇ {bt("zip", lang)}</a>'
            )
        track = self.batches.track_url(record)
        if track:
            url = html.escape(track, quote=True)
            parts.append(
                f'<a class="cosy-download" id="batch-track" href="{url}" download>⬇ {bt("track", lang)}</a>'
            )
        if record.kind == "dub" and record.is_terminal:
            url = html.escape(self.batches.report_url(record.id), quote=True)
            parts.append(
                f'<a class="cosy-download" id="batch-report" href="{url}" download>⬇ {bt("report", lang)}</a>'
            )
        return f'<div class="cosy-links">{"".join(parts)}</div>'
