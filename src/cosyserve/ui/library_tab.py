"""The voice library tab: enrol a voice from a prompt, preview, rename, delete, pick it for synthesis."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import tzinfo
from typing import Any

import gradio as gr

from cosyserve.ui import assets
from cosyserve.ui.bridge import MODES, Principal, SynthesisRequest, Voice, new_request_id
from cosyserve.ui.generate import UiError, as_gr_error, cache_copy
from cosyserve.ui.i18n import text
from cosyserve.ui.i18n_warnings import say_warnings
from cosyserve.ui.local_times import local_text
from cosyserve.ui.optional_parts import parts_note
from cosyserve.ui.studio import ModePanel, UiContext, prompt_feedback, voice_choices

ENROL_TIMEOUT_S = 600.0
PREVIEW_TIMEOUT_S = 600.0


def voice_rows(ctx: UiContext, lang: str, principal: Principal | None) -> dict[str, Any]:
    """The voices table for `lang` (headers translated): the voices `principal` may use, transcripts only
    of those it may read (`voice_rules`); empty before the page knows who is calling."""
    headers = text("voice_cols", lang).split("|")
    rows = []
    owners = ctx.bridge.owner_names(principal) if principal is not None else {}
    for voice in ctx.bridge.voices(principal) if principal is not None else []:
        report = voice.report or {}
        created = local_text(voice.created_at, ctx.bridge.time_zone, "%Y-%m-%d %H:%M")
        notes = "; ".join(say_warnings(report.get("warnings"), lang)) or "✓"
        private = ctx.bridge.may_read_private(principal, voice)
        transcript = (voice.transcript or "") if private else "—"
        access = _access(principal, voice, lang, owners)
        consent = _consent(voice, lang, ctx.bridge.time_zone) if private else "—"
        rows.append(
            [voice.name, transcript[:60], access, consent, created, report.get("duration_s", ""), notes]
        )
    return gr.update(value={"headers": headers, "data": rows}, headers=headers)


def _consent(voice: Voice, lang: str, zone: tzinfo | None) -> str:
    """Who confirmed the consent statement at enrolment, and when ("—": none recorded)."""
    if not voice.consent:
        return "—"
    at = local_text(float(voice.consent.get("at") or voice.created_at), zone, "%Y-%m-%d")
    return text("consent_given", lang, by=voice.consent.get("by") or "?", at=at)


def _access(principal: Principal, voice: Voice, lang: str, owners: dict[str, str]) -> str:
    if voice.owner is not None and voice.owner == principal.owner:
        return text("voice_own_shared" if voice.shared else "voice_own", lang)
    if voice.shared:
        return text("voice_shared", lang)
    owner = owners.get(voice.owner or "") or (voice.owner or "—").removeprefix("user:")
    return text("voice_private_of", lang, owner=owner)  # only admins see others' voices


@dataclass
class LibraryTab:
    tab: Any
    table: gr.Dataframe
    pick: gr.Dropdown

    def refresh_outputs(self, panels: list[ModePanel]) -> list[Any]:
        return [self.table, self.pick, *(panel.voice for panel in panels)]


def refresh_values(
    ctx: UiContext, lang: str, principal: Principal | None, selected: str | None = None
) -> list[Any]:
    """Updates for `LibraryTab.refresh_outputs`: the table, the picker and each mode's voice list, as
    `principal` may see them."""
    choices = voice_choices(ctx.bridge, lang, principal)
    ids = {value for _, value in choices}
    picked = selected if selected in ids and selected else None
    return [
        voice_rows(ctx, lang, principal),
        gr.update(choices=choices[1:], value=picked),
        *(gr.update(choices=choices) for _ in MODES),
    ]


@dataclass
class _VoiceList:
    """The left column: the voices, and what can be done with the one picked."""

    table: gr.Dataframe
    refresh: gr.Button
    pick: gr.Dropdown
    use: gr.Button
    delete: gr.Button
    confirm: gr.Button
    new_name: gr.Textbox
    rename: gr.Button
    preview_text: gr.Textbox
    preview: gr.Button
    preview_audio: gr.Audio
    status: gr.Markdown


@dataclass
class _EnrolForm:
    """The right column: a new voice from a recording."""

    name: gr.Textbox
    audio: gr.Audio
    feedback: gr.Markdown
    transcript: gr.Textbox
    denoise: Any
    consent: gr.Checkbox
    enrol: gr.Button


def build_library_tab(ctx: UiContext, panels: list[ModePanel], tabs: gr.Tabs) -> LibraryTab:
    tr = ctx.tr
    tab_block = gr.Tab(tr("tab_voices"), id="voices", elem_id="tab-voices")
    with tr.bind(tab_block, label="tab_voices") as tab, gr.Row(equal_height=False):
        with gr.Column(scale=6):
            voices = _voice_list(ctx)
        with gr.Column(scale=5):
            form = _enrol_form(ctx)
    library = LibraryTab(tab, voices.table, voices.pick)
    _wire(ctx, voices, form, library.refresh_outputs(panels), panels, tabs)
    return library


def _voice_list(ctx: UiContext) -> _VoiceList:
    tr = ctx.tr
    tr.bind(gr.Markdown(f"## {tr('voices_list')}"), value=lambda lang: f"## {text('voices_list', lang)}")
    table = gr.Dataframe(
        value=voice_rows(ctx, tr.lang, None)["value"], interactive=False, wrap=True, elem_id="voices-table"
    )
    refresh = tr.bind(gr.Button(tr("refresh"), size="sm", elem_id="voices-refresh"), value="refresh")
    pick = tr.bind(
        gr.Dropdown(
            choices=voice_choices(ctx.bridge, tr.lang, None)[1:],  # filled per caller on load
            value=None,
            label=tr("pick_voice"),
            elem_id="voices-pick",
        ),
        label="pick_voice",
    )
    with gr.Row():
        use = tr.bind(gr.Button(tr("use_voice"), variant="primary", elem_id="voices-use"), value="use_voice")
        delete = tr.bind(gr.Button(tr("delete"), variant="stop", elem_id="voices-delete"), value="delete")
        confirm = tr.bind(
            gr.Button(tr("confirm_delete"), variant="stop", visible=False, elem_id="voices-confirm"),
            value="confirm_delete",
        )
    with gr.Row():
        new_name = tr.bind(gr.Textbox(label=tr("new_name"), elem_id="voices-new-name"), label="new_name")
        rename = tr.bind(gr.Button(tr("rename"), elem_id="voices-rename"), value="rename")
    preview_text = tr.bind(
        gr.Textbox(label=tr("preview_text"), max_length=100, elem_id="voices-preview-text"),
        label="preview_text",
    )
    preview = tr.bind(gr.Button(tr("preview"), elem_id="voices-preview"), value="preview")
    preview_audio = tr.bind(
        gr.Audio(type="filepath", interactive=False, label=tr("preview"), elem_id="voices-preview-audio"),
        label="preview",
    )
    status = gr.Markdown("", elem_id="voices-status")
    return _VoiceList(
        table,
        refresh,
        pick,
        use,
        delete,
        confirm,
        new_name,
        rename,
        preview_text,
        preview,
        preview_audio,
        status,
    )


def _enrol_form(ctx: UiContext) -> _EnrolForm:
    tr = ctx.tr
    tr.bind(gr.Markdown(f"## {tr('enrol_title')}"), value=lambda lang: f"## {text('enrol_title', lang)}")
    name = tr.bind(
        gr.Textbox(label=tr("voice_name"), placeholder=tr("voice_name_ph"), elem_id="enrol-name"),
        label="voice_name",
        placeholder="voice_name_ph",
    )
    audio = tr.bind(
        gr.Audio(
            sources=["upload", "microphone"], type="filepath", label=tr("prompt_audio"), elem_id="enrol-audio"
        ),
        label="prompt_audio",
    )
    feedback = gr.Markdown("", elem_id="enrol-feedback", elem_classes="cosy-feedback")
    transcript = tr.bind(
        gr.Textbox(
            label=tr("transcript"),
            placeholder=tr("transcript_ph"),
            max_length=500,
            elem_id="enrol-transcript",
        ),
        label="transcript",
        placeholder="transcript_ph",
    )
    parts = ctx.bridge.optional_parts()
    denoise: Any = gr.State(False)
    if parts["denoise"].installed:
        denoise = tr.bind(gr.Checkbox(False, label=tr("denoise"), elem_id="enrol-denoise"), label="denoise")
    parts_note(tr, [parts["denoise"]], "enrol-parts")
    statement, required = ctx.bridge.consent_statement
    need = "consent_needed" if required else "consent_optional"
    consent = tr.bind(
        gr.Checkbox(
            False,
            label=statement,
            info=tr("consent_label", need=text(need, tr.lang)),
            elem_id="enrol-consent",
        ),
        info=lambda lang: text("consent_label", lang, need=text(need, lang)),
    )
    enrol = tr.bind(gr.Button(tr("enrol"), variant="primary", elem_id="enrol-submit"), value="enrol")
    return _EnrolForm(name, audio, feedback, transcript, denoise, consent, enrol)


def _wire(
    ctx: UiContext,
    voices: _VoiceList,
    form: _EnrolForm,
    outputs: list[Any],
    panels: list[ModePanel],
    tabs: gr.Tabs,
) -> None:
    actions = _LibraryActions(ctx, panels)
    lang, v = ctx.lang, voices
    form.audio.change(
        lambda path, lang: prompt_feedback(ctx.bridge, path, lang),
        [form.audio, lang],
        [form.feedback],
        show_progress="hidden",
    )
    for chosen_event in (form.audio.upload, form.audio.stop_recording):
        chosen_event(None, None, None, js=assets.refocus_js("enrol-audio"))
    # Progress and errors show on the status line only: Gradio's default overlay would cover the voices
    # table and every tab's voice list (the outputs) with an "Error" badge until it is closed by hand.
    on_status = {"show_progress_on": [v.status]}
    # (named events: scripts and tests call them as a browser would, with the same credentials)
    v.refresh.click(actions.refresh, [lang, v.pick], outputs, api_name="voices_refresh", **on_status)
    form.enrol.click(
        actions.enrol,
        [lang, form.name, form.audio, form.transcript, form.denoise, form.consent],
        [v.status, *outputs],
        concurrency_id="synthesis",  # with the Generate clicks' limit: a group takes its smallest
        concurrency_limit=ctx.concurrency_limit,
        api_name="voice_enrol",
        **on_status,
    )
    v.preview.click(
        actions.preview,
        [lang, v.pick, v.preview_text],
        [v.preview_audio, v.status],
        concurrency_id="synthesis",
        concurrency_limit=ctx.concurrency_limit,
        api_name="voice_preview",
    )
    v.rename.click(
        actions.rename,
        [lang, v.pick, v.new_name],
        [v.status, v.new_name, *outputs],
        api_name="voice_rename",
        **on_status,
    )
    v.delete.click(actions.ask_delete, [lang, v.pick], [v.confirm], **on_status)
    v.confirm.click(
        actions.delete, [lang, v.pick], [v.status, v.confirm, *outputs], api_name="voice_delete", **on_status
    ).then(None, js=assets.focus_js("voices-delete"))  # the focused Confirm is hidden: back to Delete
    # a voice shared with this user, not its own: no Rename or Delete to press only to be refused
    v.pick.change(actions.manageable, [v.pick], [v.delete, v.confirm, v.new_name, v.rename])
    v.use.click(
        actions.use,
        [lang, v.pick],
        [v.status, tabs, *(p.voice for p in panels)],
        api_name="voice_use",
        **on_status,
    )


class _LibraryActions:
    """The voice library tab's event handlers."""

    def __init__(self, ctx: UiContext, panels: list[ModePanel]) -> None:
        self.ctx, self.bridge, self.panels = ctx, ctx.bridge, panels

    def refresh(self, lang: str, picked: str | None, request: gr.Request) -> list[Any]:
        try:
            principal = self.bridge.principal_of(request)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        return refresh_values(self.ctx, lang, principal, picked)

    def enrol(
        self,
        lang: str,
        voice_name: str,
        path: str | None,
        said: str,
        denoise: bool,
        consent: bool,
        request: gr.Request,
    ) -> list[Any]:
        request_id = new_request_id()
        try:
            principal = self.bridge.principal_of(request)
            if not path:
                raise UiError("err_no_recording")
            ticket = self.bridge.enrol(
                principal, voice_name, path, said, request_id, bool(denoise), consent=bool(consent)
            )
            voice = ticket.result(ENROL_TIMEOUT_S)
        except Exception as exc:
            raise as_gr_error(exc, lang, request_id) from None
        message = text("enrolled", lang, name=voice.name)
        return [message, *refresh_values(self.ctx, lang, principal, voice.id)]

    def preview(self, lang: str, voice_id: str | None, words: str, request: gr.Request) -> tuple[Any, str]:
        request_id = new_request_id()
        bridge, cache_dir = self.bridge, self.ctx.cache_dir
        try:
            principal = bridge.principal_of(request)
            if not voice_id:
                raise UiError("select_first")
            voice = bridge.voice(principal, voice_id)
            if not (words or "").strip():  # the recording itself: its owner's and admins' only
                return cache_copy(bridge.voice_recording(principal, voice.id), cache_dir, principal), ""
            synthesis = SynthesisRequest(text=words.strip(), voice=voice.id)
            ticket = bridge.submit(principal, synthesis, mode="preview", request_id=request_id)
            outcome = ticket.result(PREVIEW_TIMEOUT_S)
            if outcome.output_id is None:
                return None, ""
            output = bridge.made_output(outcome.output_id)
            return cache_copy(output.path, cache_dir, principal), ""
        except Exception as exc:
            raise as_gr_error(exc, lang, request_id) from None

    def rename(self, lang: str, voice_id: str | None, wanted: str, request: gr.Request) -> list[Any]:
        try:
            principal = self.bridge.principal_of(request)
            if not voice_id:
                raise UiError("select_first")
            voice = self.bridge.rename_voice(principal, voice_id, wanted)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        updated = refresh_values(self.ctx, lang, principal, voice.id)
        return [text("renamed", lang, name=voice.name), "", *updated]

    def ask_delete(self, lang: str, voice_id: str | None) -> Any:
        if not voice_id:
            raise as_gr_error(UiError("select_first"), lang)
        return gr.update(visible=True)

    def delete(self, lang: str, voice_id: str | None, request: gr.Request) -> list[Any]:
        try:
            principal = self.bridge.principal_of(request)
            if not voice_id:
                raise UiError("select_first")
            voice = self.bridge.delete_voice(principal, voice_id)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        return [
            text("deleted", lang, name=voice.name),
            gr.update(visible=False),
            *refresh_values(self.ctx, lang, principal),
        ]

    def manageable(self, voice_id: str | None, request: gr.Request) -> list[Any]:
        shown = True  # nothing picked: the buttons say "pick a voice first" when pressed
        if voice_id:
            try:
                principal = self.bridge.principal_of(request)
                shown = self.bridge.may_change_voice(principal, self.bridge.voice(principal, voice_id))
            except Exception:  # gone, or signed out: the buttons answer why when pressed
                shown = True
        hidden = gr.update(visible=False)
        return [gr.update(visible=shown), hidden, gr.update(visible=shown), gr.update(visible=shown)]

    def use(self, lang: str, voice_id: str | None, request: gr.Request) -> list[Any]:
        if not voice_id:
            raise as_gr_error(UiError("select_first"), lang)
        try:
            voice = self.bridge.voice(self.bridge.principal_of(request), voice_id)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None
        target = "zero_shot" if voice.transcript else "cross_lingual"
        message = text("using_voice", lang, name=voice.name)
        return [message, gr.Tabs(selected=target), *(gr.update(value=voice.id) for _ in self.panels)]
