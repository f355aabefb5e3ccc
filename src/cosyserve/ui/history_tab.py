"""The history tab: this user's results from the output store (so it survives reloads and restarts).

Each entry plays and downloads (signed links to the output store), shows its parameters, and can be run
again: "Re-run" puts the parameters into the tab of its mode and generates there at once when the voice
is a saved one, or when the recording loaded in that tab is the one it was made from (same sha256).
The list is searched and filtered by text, voice, kind (`history_filter`) and day; an entry is deleted by
the API's rule (a user its own, an admin any: admins may list everyone's entries for that).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from cosyserve.errors import OutputNotFound
from cosyserve.ui.bridge import INSTRUCT_PRESETS, MODES, Principal
from cosyserve.ui.generate import UiError, as_gr_error, cache_copy
from cosyserve.ui.history_filter import (
    ANY,
    KINDS,
    HistoryFilter,
    day_choices,
    filter_from,
    history_links,
    output_mode,
    voice_choices,
)
from cosyserve.ui.history_table import COLUMN_WIDTHS, ID_PREFIX, OWNER_COLUMN_WIDTHS, history_rows
from cosyserve.ui.i18n import text
from cosyserve.ui.studio import ModePanel, UiContext

HISTORY_LIMIT = 100  # rows shown
SEARCH_LIMIT = 1000  # newest results searched and filtered (the output store's largest page)
PRESET_IDS = frozenset(preset.id for preset in INSTRUCT_PRESETS)


__all__ = ["HistoryTab", "build_history_tab", "history_links", "history_rows", "output_mode"]


@dataclass
class _Filters:
    search: gr.Textbox
    voice: gr.Dropdown
    kind: gr.Dropdown
    day: gr.Dropdown
    everyone: gr.Checkbox

    @property
    def inputs(self) -> list[Any]:
        return [self.search, self.voice, self.kind, self.day, self.everyone]


@dataclass
class HistoryTab:
    tab: Any
    table: gr.Dataframe
    pick: gr.Dropdown
    filters: _Filters
    status: gr.Markdown
    links: gr.HTML
    refresh: Any = None  # (lang, request) -> updates for `refresh_outputs`, the filters reset

    @property
    def refresh_outputs(self) -> list[Any]:
        """(the links too: a language switch that keeps the same entry picked must relabel them)"""
        return [self.table, self.pick, self.status, *self.filters.inputs, self.links]

    @property
    def listing_outputs(self) -> list[Any]:
        """What a filter change updates: the rows, the entry picked, the status, the voice and day choices."""
        return [self.table, self.pick, self.status, self.filters.voice, self.filters.day]


def build_history_tab(ctx: UiContext, panels: list[ModePanel], tabs: gr.Tabs) -> HistoryTab:
    tr = ctx.tr
    with tr.bind(gr.Tab(tr("tab_history"), id="history", elem_id="tab-history"), label="tab_history") as tab:
        with gr.Row(equal_height=True):
            # (labels and choices are set by `refresh_values`, in the page's language)
            filters = _Filters(
                gr.Textbox(label=tr("history_search"), max_lines=1, scale=4, elem_id="history-search"),
                gr.Dropdown(choices=[], label=tr("history_voice"), scale=2, elem_id="history-voice"),
                gr.Dropdown(choices=[], label=tr("history_kind"), scale=2, elem_id="history-kind"),
                gr.Dropdown(choices=[], label=tr("history_day"), scale=2, elem_id="history-day"),
                gr.Checkbox(False, label=tr("history_everyone"), visible=False, elem_id="history-everyone"),
            )
            refresh = tr.bind(
                gr.Button(tr("refresh"), size="sm", scale=1, elem_id="history-refresh"), value="refresh"
            )
        table = gr.Dataframe(
            interactive=False,
            wrap=True,
            elem_id="history-table",
            column_widths=COLUMN_WIDTHS,
        )
        with gr.Row(equal_height=False):
            with gr.Column(scale=5):
                pick = tr.bind(
                    gr.Dropdown(choices=[], value=None, label=tr("history_pick"), elem_id="history-pick"),
                    label="history_pick",
                )
                audio = tr.bind(
                    gr.Audio(
                        type="filepath", interactive=False, label=tr("history_audio"), elem_id="history-audio"
                    ),
                    label="history_audio",
                )
                links = gr.HTML("", elem_id="history-links")
                with gr.Row():
                    rerun = tr.bind(
                        gr.Button(tr("rerun"), variant="primary", elem_id="history-rerun"), value="rerun"
                    )
                    delete = tr.bind(
                        gr.Button(tr("history_delete"), variant="stop", elem_id="history-delete"),
                        value="history_delete",
                    )
                status = gr.Markdown("", elem_id="history-status")
            with gr.Column(scale=5):
                params = tr.bind(
                    gr.JSON(label=tr("history_params"), elem_id="history-params"), label="history_params"
                )
    history = HistoryTab(tab, table, pick, filters, status, links)
    actions = _HistoryActions(ctx, panels)
    history.refresh = actions.refresh_values
    lang = ctx.lang
    listing = history.listing_outputs
    refresh.click(actions.listing, [lang, *filters.inputs], listing)
    filters.search.submit(actions.listing, [lang, *filters.inputs], listing)
    for field in (filters.voice, filters.kind, filters.day, filters.everyone):
        field.input(actions.listing, [lang, *filters.inputs], listing)
    # its error (if any) marks the status line, not the table it would blank until a refresh
    delete.click(actions.delete, [lang, pick, *filters.inputs], listing, show_progress_on=[status])
    table.select(_select_row, [table], [pick])
    pick.change(actions.show, [lang, pick], [audio, links, params, status])
    flags = [gr.State(False) for _ in panels]
    field_outputs = [component for fields in actions.panel_fields for component in fields.values()]
    rerun.click(None, None, None, js="() => { if (window.cosyStream) window.cosyStream.unlock(); }")
    chain = rerun.click(
        actions.load_for_rerun,
        [lang, pick, *(panel.prompt for panel in panels)],
        [status, tabs, *field_outputs, *flags],
    )
    for panel, flag in zip(panels, flags, strict=True):
        chain = chain.then(
            _autorun(panel), [flag, lang], [*panel.run_outputs, flag], inputs_kwargs=panel.run_inputs
        )
    chain.then(actions.listing, [lang, *filters.inputs], listing, show_progress="hidden")
    return history


class _HistoryActions:
    """The history tab's event handlers."""

    def __init__(self, ctx: UiContext, panels: list[ModePanel]) -> None:
        self.ctx, self.bridge, self.panels = ctx, ctx.bridge, panels
        self.panel_fields = [_fields(panel) for panel in panels]

    def refresh_values(self, lang: str, request: gr.Request) -> list[Any]:
        """The newest entries, the filters reset (labels and choices in `lang`): for `refresh_outputs`."""
        try:
            principal = self.bridge.principal_of(request)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        rows, pick, status, voice, day = self._listing(lang, principal, HistoryFilter(), False)
        kinds = [(text("history_any", lang), ANY), *((text(f"mode_{k}", lang), k) for k in KINDS)]
        return [
            rows,
            pick,
            status,
            gr.update(value="", label=text("history_search", lang)),
            voice,
            gr.update(choices=kinds, value=ANY, label=text("history_kind", lang)),
            day,
            gr.update(value=False, visible=principal.is_admin, label=text("history_everyone", lang)),
            self._links_of(principal, pick["value"], lang),
        ]

    def _links_of(self, principal: Principal, output_id: str | None, lang: str) -> str:
        if not output_id:
            return ""
        try:
            return history_links(self.bridge, self.bridge.output(principal, output_id), lang)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None

    def listing(
        self,
        lang: str,
        query: str | None,
        voice: str | None,
        kind: str | None,
        day: str | None,
        everyone: bool,
        request: gr.Request,
    ) -> list[Any]:
        """The entries the filters let through: for `listing_outputs`."""
        try:
            principal = self.bridge.principal_of(request)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        wanted = filter_from(query, voice, kind, day, self.bridge.time_zone)
        return self._listing(lang, principal, wanted, bool(everyone))

    def delete(
        self,
        lang: str,
        output_id: str | None,
        query: str | None,
        voice: str | None,
        kind: str | None,
        day: str | None,
        everyone: bool,
        request: gr.Request,
    ) -> list[Any]:
        """Delete the picked entry (a user its own, an admin any), then list again with none picked: a
        second click deletes nothing (it deleted the next entry, silently)."""
        if not output_id:
            raise as_gr_error(UiError("history_pick_first"), lang)
        said = text("history_deleted", lang, id=output_id.removeprefix(ID_PREFIX))
        try:
            self.bridge.delete_output(self.bridge.principal_of(request), output_id)
        except OutputNotFound:  # deleted meanwhile (another tab) or expired: the list catches up
            said = text("history_gone", lang)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        updates = self.listing(lang, query, voice, kind, day, everyone, request)
        updates[1] = {**updates[1], "value": None}  # the pick: none
        updates[2] = said
        return updates

    def _listing(self, lang: str, principal: Principal, wanted: HistoryFilter, everyone: bool) -> list[Any]:
        try:
            outputs = self.bridge.history(principal, SEARCH_LIMIT, everyone=everyone)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        shown = wanted.apply(outputs, HISTORY_LIMIT)
        owners = None
        if everyone and principal.is_admin:  # whose each entry is
            owners = {f"key:{view['id']}": str(view["name"]) for view in self.bridge.keys(principal)}
        rows = history_rows(self.ctx, principal, shown, lang, owners)
        choices = [(f"{row[0]} · {row[2]}", ID_PREFIX + row[-1]) for row in rows["data"]]
        first = choices[0][1] if choices else None
        status = "" if shown else text("history_no_match" if wanted.active else "history_empty", lang)
        if wanted.active and len(outputs) >= SEARCH_LIMIT:  # older ones exist and were not searched
            status = f"{status} {text('history_searched_newest', lang, count=SEARCH_LIMIT)}".strip()
        names = {voice.id: voice.name for voice in self.bridge.voices(principal)}
        any_label = text("history_any", lang)
        voices = voice_choices(outputs, names, any_label, text("uploaded", lang))
        days = day_choices(outputs, any_label, self.bridge.time_zone)
        widths = COLUMN_WIDTHS if owners is None else OWNER_COLUMN_WIDTHS
        return [
            gr.update(value=rows, column_widths=widths),
            gr.update(choices=choices, value=first),
            status,
            gr.update(choices=voices, value=_kept(wanted.voice, voices), label=text("history_voice", lang)),
            gr.update(choices=days, value=_kept(wanted.day, days), label=text("history_day", lang)),
        ]

    def show(self, lang: str, output_id: str | None, request: gr.Request) -> list[Any]:
        if not output_id:
            return [None, "", None, gr.update()]  # the listing says why there is none
        try:
            principal = self.bridge.principal_of(request)
            output = self.bridge.output(principal, output_id)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        return [
            cache_copy(output.path, self.ctx.cache_dir, principal),
            history_links(self.bridge, output, lang),
            output.manifest,
            "",
        ]

    def load_for_rerun(
        self,
        lang: str,
        output_id: str | None,
        p0: str | None,
        p1: str | None,
        p2: str | None,
        request: gr.Request,
    ) -> list[Any]:
        prompts = (p0, p1, p2)
        if not output_id:
            raise gr.Error(
                text("history_empty", lang), title=text("error_title", lang), print_exception=False
            )
        try:
            output = self.bridge.output(self.bridge.principal_of(request), output_id)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        m = output.manifest
        mode = output_mode(m)
        mode = mode if mode in MODES else ("zero_shot" if m.get("voice") else "cross_lingual")
        index = MODES.index(mode)
        autorun = bool(m.get("voice")) or _same_audio(prompts[index], m.get("prompt_wav_sha256"))
        updates: list[Any] = []
        for i, fields in enumerate(self.panel_fields):
            values = _values_for(m) if i == index else {}
            updates.extend(
                gr.update(value=values[name]) if name in values else gr.update() for name in fields
            )
        message = "" if autorun else text("rerun_loaded", lang, tab=text(f"tab_{mode}", lang))
        return [
            message,
            gr.Tabs(selected=mode),
            *updates,
            *(i == index and autorun for i in range(len(self.panels))),
        ]


def _kept(value: str | None, choices: list[tuple[str, str]]) -> str:
    """`value` when it is still a choice, else "all"."""
    return value if value is not None and any(value == v for _, v in choices) else ANY


def _select_row(evt: gr.SelectData, rows: Any) -> Any:
    try:
        data = rows["data"] if isinstance(rows, dict) else rows.values.tolist()
        return ID_PREFIX + str(data[evt.index[0]][-1])
    except (IndexError, KeyError, TypeError, AttributeError):
        return gr.update()


def _fields(panel: ModePanel) -> dict[str, Any]:
    """The components re-run fills, by manifest-derived name (placeholders of other modes left out)."""
    fields = {
        "voice": panel.voice,
        "text": panel.text,
        "seed": panel.seed,
        "speed": panel.speed,
        "volume": panel.volume,
    }
    for name in ("transcript", "preset", "instruct"):
        component = getattr(panel, name)
        if not isinstance(component, gr.State):
            fields[name] = component
    return fields


def _values_for(m: dict[str, Any]) -> dict[str, Any]:
    instruct = (m.get("instruct") or "").strip()
    preset = instruct if instruct in PRESET_IDS else ""
    return {
        "voice": m.get("voice") or "",
        "text": m.get("text") or "",
        "seed": "" if m.get("seed") is None else str(m.get("seed")),
        "speed": m.get("speed") or 1.0,
        "volume": m.get("volume") or 1.0,
        "transcript": m.get("prompt_text") or "",
        "preset": preset,
        "instruct": "" if preset else instruct,
    }


def _same_audio(path: str | None, sha256: str | None) -> bool:
    if not path or not sha256:
        return False
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest() == sha256
    except OSError:
        return False


def _autorun(panel: ModePanel) -> Any:
    def maybe_run(
        flag: bool,
        lang: str,
        request: gr.Request,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 - Gradio finds its tracker by this default
        **values: Any,
    ) -> Any:
        if not flag:
            yield (*(gr.update() for _ in panel.run_outputs), False)
            return
        if panel.run_fn is None:
            raise RuntimeError("the panel was not wired")
        for update in panel.run_fn(lang, request, progress, **values):
            yield (*update, False)

    return maybe_run
