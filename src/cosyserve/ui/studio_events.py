"""The events of one synthesis tab: the saved voice locking the recording fields, the prompt checks, noise
reduction (before/after), transcription, the instruction actually used, the text preview, Generate and
Cancel."""

from __future__ import annotations

from typing import Any

import gradio as gr

from cosyserve.ui import assets
from cosyserve.ui.bridge import Principal, resolve_instruction
from cosyserve.ui.file_owners import owned_folder
from cosyserve.ui.generate import Form, UiError, as_gr_error
from cosyserve.ui.i18n import text
from cosyserve.ui.messages import as_written
from cosyserve.ui.preview import form_preview
from cosyserve.ui.studio import ModePanel, UiContext, prompt_feedback, voice_choices
from cosyserve.ui.synthesis_run import run_synthesis


def voice_lock(ctx: UiContext, principal: Principal, mode: str, voice_id: str | None, lang: str) -> list[Any]:
    """[note, prompt, transcript, denoise] for a saved voice choice: with a voice the recording fields are
    off and the note says which transcript is used; without one they are on again."""
    if not voice_id:
        return [
            "",
            gr.update(interactive=True),
            gr.update(interactive=True, value=""),
            gr.update(interactive=True),
        ]
    voice = ctx.bridge.voice(principal, voice_id)
    readable = ctx.bridge.may_read_private(principal, voice)
    if not readable:  # a voice shared with the caller: its recording's words stay its owner's
        transcript = text("transcript_private", lang) if voice.transcript else text("no_transcript", lang)
    else:
        transcript = as_written(voice.transcript) if voice.transcript else text("no_transcript", lang)
    key = "voice_note_zero_shot" if mode == "zero_shot" else "voice_note_other"
    note = "ⓘ " + text(key, lang, name=as_written(voice.name), transcript=transcript)
    return [
        note,
        gr.update(interactive=False),
        gr.update(interactive=False, value=(voice.transcript or "") if readable else ""),
        gr.update(interactive=False, value=False),
    ]


def instruction_note(instruct: str | None, preset: str | None, lang: str) -> str:
    """The wording the model gets when it differs from what was typed (a preset paraphrase)."""
    typed = (instruct or "").strip()
    if not typed:
        return ""
    used = resolve_instruction(typed)
    return "ⓘ " + text("instruct_mapped", lang, wording=used) if used and used != typed else ""


def wire_panel(panel: ModePanel, ctx: UiContext) -> None:
    bridge, mode = ctx.bridge, panel.mode
    lang = ctx.lang
    has_transcript = not isinstance(panel.transcript, gr.State)
    has_denoise = not isinstance(panel.denoise, gr.State)

    def on_voice(voice_id: str | None, chosen: str, request: gr.Request) -> list[Any]:
        try:
            principal = bridge.principal_of(request)
            note, prompt, transcript, denoise = voice_lock(ctx, principal, mode, voice_id, chosen)
        except Exception as exc:
            raise as_gr_error(exc, chosen) from None
        return [note, prompt, *([transcript] if has_transcript else []), *([denoise] if has_denoise else [])]

    voice_outputs = [panel.voice_note, panel.prompt]
    voice_outputs += [panel.transcript] if has_transcript else []
    voice_outputs += [panel.denoise] if has_denoise else []
    panel.voice.change(  # (an error shows on the note only: never an overlay over the voice fields)
        on_voice,
        [panel.voice, lang],
        voice_outputs,
        show_progress="hidden",
        show_progress_on=[panel.voice_note],
        api_name=f"{mode}_voice",
    )

    def feedback(path: str | None, chosen: str) -> str:
        return prompt_feedback(bridge, path, chosen)

    panel.prompt.change(feedback, [panel.prompt, lang], [panel.feedback], show_progress="hidden")
    for chosen_event in (panel.prompt.upload, panel.prompt.stop_recording):
        chosen_event(None, None, None, js=assets.refocus_js(f"{mode}-prompt"))
    if has_denoise:

        def cleaned(path: str | None, on: bool, chosen: str, request: gr.Request) -> Any:
            if not (path and on):
                return gr.update(value=None, visible=False)
            try:  # in a folder only its user may fetch (it sat where any signed-in user could)
                folder = owned_folder(ctx.cache_dir, bridge.principal_of(request))
                return gr.update(value=bridge.denoised_copy(path, folder), visible=True)
            except Exception as exc:
                raise as_gr_error(exc, chosen) from None

        for trigger in (panel.denoise.change, panel.prompt.change):
            trigger(cleaned, [panel.prompt, panel.denoise, lang], [panel.denoised], show_progress="hidden")
    if panel.transcribe is not None:

        def transcribe(path: str | None, chosen: str) -> str:
            try:
                if not path:
                    raise UiError("err_no_prompt")
                return bridge.transcribe(path)
            except Exception as exc:
                raise as_gr_error(exc, chosen) from None

        panel.transcribe.click(transcribe, [panel.prompt, lang], [panel.transcript])
    if mode == "instruct":
        for trigger in (panel.instruct.change, panel.preset.change):
            trigger(
                instruction_note,
                [panel.instruct, panel.preset, lang],
                [panel.instruct_note],
                show_progress="hidden",
            )
    _wire_text_and_run(panel, ctx)


def _wire_text_and_run(panel: ModePanel, ctx: UiContext) -> None:
    bridge, registry, mode, lang = ctx.bridge, ctx.registry, panel.mode, ctx.lang
    counter = assets.counter_js(bridge.max_text_chars, bridge.max_job_chars)
    panel.text.change(None, [panel.text, lang], [panel.counter], js=counter)
    panel.dice.click(None, None, [panel.seed], js=assets.DICE_JS)

    def preview(chosen: str, request: gr.Request, **values: Any) -> str:
        try:
            principal = bridge.principal_of(request)
        except Exception as exc:
            raise as_gr_error(exc, chosen) from None
        return form_preview(bridge, principal, Form(mode, **values), chosen)

    panel.preview_button.click(preview, [lang], [panel.preview], inputs_kwargs=panel.run_inputs)

    def run(
        chosen: str,
        request: gr.Request,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 - Gradio finds its tracker by this default
        click: str = "",
        **values: Any,
    ) -> Any:
        form = Form(mode, **values)
        yield from run_synthesis(bridge, registry, form, chosen, request, progress, ctx.cache_dir, click)

    def cancel(click: str, request: gr.Request) -> None:
        # Only the running handler writes the outcome (cancelled, or finished before the cancel arrived):
        # a message from here could arrive after it and overwrite it. `click`: the page's last Generate
        # click, which may still wait in the page's queue (it is then cancelled as it starts).
        registry.cancel(getattr(request, "session_hash", None) or "", click)

    run_inputs = {**panel.run_inputs, "click": panel.click}  # the token last: the page's script sets it
    panel.run_fn = run
    panel.generate.click(None, None, None, js=assets.UNLOCK_JS)
    panel.run_event = panel.generate.click(
        run,
        [lang],
        panel.run_outputs,
        js=assets.click_js(mode, 1 + len(run_inputs)),
        inputs_kwargs=run_inputs,
        concurrency_limit=ctx.concurrency_limit,
        concurrency_id="synthesis",
        show_progress="full",
        show_progress_on=[panel.result],  # one status (and at most one "Error" badge), on the player
    )

    def keep_voices(selected: str | None, chosen: str, request: gr.Request) -> Any:
        # (annotated, so that Gradio hands it the request: a lambda got two arguments of its three)
        return voice_still_there(bridge, selected, chosen, request)

    panel.run_event.then(  # a voice deleted meanwhile leaves the list (it stayed there, still selected)
        keep_voices,
        [panel.voice, lang],
        [panel.voice],
        show_progress="hidden",
    )
    panel.stream_box.change(None, [panel.stream_box], None, js=assets.FEED_JS)
    panel.cancel.click(cancel, [panel.click], None, js=assets.cancel_js(mode), queue=False)


def voice_still_there(bridge: Any, selected: str | None, lang: str, request: gr.Request) -> Any:
    """After a run: the voice list again, without the selected voice if it is gone (an admin deleted it,
    its owner in another tab), so the page stops offering what the error said no longer exists."""
    if not selected:
        return gr.update()
    try:
        choices = voice_choices(bridge, lang, bridge.principal_of(request))
    except Exception:  # signed out meanwhile: the session bar says so
        return gr.update()
    if selected in {value for _, value in choices}:
        return gr.update()
    return gr.update(choices=choices, value="")
