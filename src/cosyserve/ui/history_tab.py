"""The history tab: this user's results from the output store (so it survives reloads and restarts).

Each entry plays and downloads (signed links to the output store), shows its parameters, and can be run
again: "Re-run" puts the parameters into the tab of its mode and generates there at once when the voice
is a saved one, or when the recording loaded in that tab is the one it was made from (same sha256).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from cosyserve.frontend.text.presets import INSTRUCT_PRESETS
from cosyserve.service.access.principals import Principal
from cosyserve.service.stores.outputs import StoredOutput
from cosyserve.ui.bridge import DOWNLOAD_FORMATS, MODES
from cosyserve.ui.generate import as_gr_error, cache_copy, links_html
from cosyserve.ui.i18n import text
from cosyserve.ui.studio import ModePanel, UiContext

HISTORY_LIMIT = 100
ID_PREFIX = "output_"  # left out of the table's id column, which stays narrow
PRESET_IDS = frozenset(preset.id for preset in INSTRUCT_PRESETS)


def output_mode(manifest: dict[str, Any]) -> str:
    """zero_shot, cross_lingual or instruct (or "api" for what the API made outside these modes)."""
    mode = (manifest.get("parameters") or {}).get("ui_mode")
    if mode in MODES or mode == "preview":  # a voice preview from the library is labelled as one
        return mode
    if (manifest.get("instruct") or "").strip():
        return "instruct"
    if (manifest.get("prompt_text") or "").strip():
        return "zero_shot"
    if manifest.get("voice") and manifest.get("prompt_text") is None:
        return "api"
    return "cross_lingual"


def history_rows(
    ctx: UiContext, principal: Principal, outputs: list[StoredOutput], lang: str
) -> dict[str, Any]:
    headers = text("history_cols", lang).split("|")
    voices = {voice.id: voice.name for voice in ctx.bridge.voices(principal)}
    rows = []
    for output in outputs:
        m = output.manifest
        mode = output_mode(m)
        created = time.strftime("%m-%d %H:%M:%S", time.localtime(output.created_at))
        voice = voices.get(m.get("voice") or "", m.get("voice")) or text("uploaded", lang)
        rows.append(
            [
                created,
                text(f"mode_{mode}", lang),
                (m.get("text") or "")[:60],
                voice,
                m.get("seed"),
                m.get("duration_s"),
                output.id.removeprefix(ID_PREFIX),
            ]
        )
    return {"headers": headers, "data": rows}


@dataclass
class HistoryTab:
    tab: Any
    table: gr.Dataframe
    pick: gr.Dropdown
    refresh: Any = None  # (lang, request) -> updates for `refresh_outputs`

    @property
    def refresh_outputs(self) -> list[Any]:
        return [self.table, self.pick]


def build_history_tab(ctx: UiContext, panels: list[ModePanel], tabs: gr.Tabs) -> HistoryTab:
    tr = ctx.tr
    with tr.bind(gr.Tab(tr("tab_history"), id="history", elem_id="tab-history"), label="tab_history") as tab:
        refresh = tr.bind(gr.Button(tr("refresh"), size="sm", elem_id="history-refresh"), value="refresh")
        table = gr.Dataframe(
            interactive=False,
            wrap=True,
            elem_id="history-table",
            column_widths=["13%", "10%", "27%", "14%", "11%", "8%", "17%"],
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
                rerun = tr.bind(
                    gr.Button(tr("rerun"), variant="primary", elem_id="history-rerun"), value="rerun"
                )
                status = gr.Markdown("", elem_id="history-status")
            with gr.Column(scale=5):
                params = tr.bind(
                    gr.JSON(label=tr("history_params"), elem_id="history-params"), label="history_params"
                )
    history = HistoryTab(tab, table, pick)
    actions = _HistoryActions(ctx, panels)
    history.refresh = actions.refresh_values
    lang = ctx.lang
    refresh.click(actions.refresh_values, [lang], history.refresh_outputs)
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
    chain.then(actions.refresh_values, [lang], history.refresh_outputs, show_progress="hidden")
    return history


class _HistoryActions:
    """The history tab's event handlers."""

    def __init__(self, ctx: UiContext, panels: list[ModePanel]) -> None:
        self.ctx, self.bridge, self.panels = ctx, ctx.bridge, panels
        self.panel_fields = [_fields(panel) for panel in panels]

    def refresh_values(self, lang: str, request: gr.Request) -> list[Any]:
        try:
            principal = self.bridge.principal_of(request)
            outputs = self.bridge.history(principal, HISTORY_LIMIT)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        rows = history_rows(self.ctx, principal, outputs, lang)
        choices = [(f"{row[0]} · {row[2]}", ID_PREFIX + row[-1]) for row in rows["data"]]
        first = choices[0][1] if choices else None
        return [rows, gr.update(choices=choices, value=first)]

    def show(self, lang: str, output_id: str | None, request: gr.Request) -> list[Any]:
        if not output_id:
            return [None, "", None, text("history_empty", lang)]
        try:
            output = self.bridge.output(self.bridge.principal_of(request), output_id)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        parameters = output.manifest.get("parameters") or {}
        fmt = parameters.get("ui_format") or parameters.get("response_format")
        fmt = fmt if fmt in DOWNLOAD_FORMATS else "wav"
        return [
            cache_copy(output.path, self.ctx.cache_dir),
            links_html(self.bridge, output, lang, fmt),
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
