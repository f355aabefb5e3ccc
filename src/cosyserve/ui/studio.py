"""The three synthesis tabs (zero-shot clone, cross-lingual, instruct): one builder, one panel per mode.

Layout: the voice source on the left (saved voice, or a recording with its checks, noise reduction and
transcript); on the right the text, Generate/Cancel and the result right below it (above the fold at
1400×1000), the text preview, then the fine controls, the help and the examples. The events are wired in
`studio_events` (`ui/app.py` calls `wire_panel` on each panel).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from cosyserve.errors import InputError
from cosyserve.limits import MAX_SPEED, MIN_SPEED
from cosyserve.ui import assets
from cosyserve.ui.bridge import Principal, UiBridge, Voice
from cosyserve.ui.generate import TicketRegistry, error_message
from cosyserve.ui.i18n import Translator, text
from cosyserve.ui.i18n_warnings import say_warnings
from cosyserve.ui.optional_parts import parts_note
from cosyserve.ui.studio_help import EXAMPLES, HELP, preset_choices


def voice_choices(bridge: UiBridge, lang: str, principal: Principal | None) -> list[tuple[str, str]]:
    """The saved-voice choices for `principal` (none before the page knows who is calling: the page's
    own config, which every visitor gets, must name nobody's voices)."""
    voices = bridge.voices(principal) if principal is not None else []
    owners = bridge.owner_names(principal) if principal is not None else {}
    return [(text("no_voice", lang), "")] + [
        (voice_label(voice, principal, owners), voice.id) for voice in voices
    ]


def voice_label(voice: Voice, principal: Principal | None, owners: dict[str, str]) -> str:
    """A voice's name; for an admin, another owner's voice also names whose it is (two users may each
    have a "narrator")."""
    if principal is None or not principal.is_admin or voice.owner in (None, principal.owner):
        return voice.name
    return f"{voice.name} · {owners.get(voice.owner) or voice.owner.removeprefix('user:')}"


def prompt_feedback(bridge: UiBridge, path: str | None, lang: str) -> str:
    """Markdown telling whether a prompt recording is usable, with its duration, level and SNR."""
    if not path:
        return text("prompt_none", lang)
    try:
        report = bridge.check_prompt(path)
    except InputError as exc:
        reason = html.escape(error_message(exc, lang))
        return f'<span class="bad">{text("prompt_bad", lang)}</span>: {reason}'
    stats = text(
        "prompt_stats",
        lang,
        duration=report.duration_s,
        speech=report.speech_s,
        peak=report.peak_dbfs,
        rms=report.rms_dbfs,
        rate=report.sample_rate,
    )
    stats += " · " + text("prompt_snr", lang, snr=report.snr_db)
    if report.warnings:
        notes = "".join(f"\n- {html.escape(w)}" for w in say_warnings(report.warnings, lang))
        return f'<span class="warn">{text("prompt_warn", lang)}</span> · {stats}\n{notes}'
    return f"{text('prompt_ok', lang)} · {stats}"


@dataclass
class UiContext:
    """What every part of the page shares."""

    bridge: UiBridge
    tr: Translator
    registry: TicketRegistry
    lang: gr.State
    cache_dir: str
    concurrency_limit: int


# The inputs of one synthesis, by name: ModePanel attributes, Form fields and the Generate callback's
# keyword arguments all use these names, so the list is written once.
RUN_FIELDS = ("voice", "prompt", "transcript", "preset", "instruct", "text", "seed", "speed", "volume",
              "takes", "stream", "denoise", "consent")  # fmt: skip


@dataclass
class ModePanel:
    mode: str
    tab: Any
    voice: gr.Dropdown
    voice_note: gr.Markdown
    prompt: gr.Audio
    feedback: gr.Markdown
    denoise: Any  # gr.Checkbox, or a State placeholder where RNNoise is not installed
    consent: gr.Checkbox  # the consent statement, for a recording
    denoised: gr.Audio
    transcript: Any  # gr.Textbox, or a State placeholder in modes without one
    transcribe: Any  # gr.Button, or None where no transcription model is installed
    preset: Any
    instruct: Any
    instruct_note: Any
    text: gr.Textbox
    counter: gr.HTML
    generate: gr.Button
    cancel: gr.Button
    preview_button: gr.Button
    progress: gr.HTML
    result: gr.Audio
    links: gr.HTML
    info: gr.Markdown
    preview: gr.HTML
    seed: gr.Textbox
    dice: gr.Button
    speed: gr.Slider
    volume: gr.Slider
    takes: gr.Slider
    stream: gr.Checkbox
    stream_box: gr.Textbox
    click: gr.Textbox
    run_fn: Callable[..., Any] | None = None  # run(lang, request, progress, **{RUN_FIELDS: values})
    run_event: Any = None  # the Generate click, for chaining

    @property
    def run_inputs(self) -> dict[str, Any]:
        """The synthesis inputs as Gradio `inputs_kwargs` (the callback gets them by name)."""
        return {name: getattr(self, name) for name in RUN_FIELDS}

    @property
    def run_outputs(self) -> list[Any]:
        return [self.result, self.links, self.info, self.stream_box, self.progress, self.preview]


def build_mode_panel(mode: str, ctx: UiContext) -> ModePanel:
    """One mode's tab: voice source, text, Generate/Cancel and the result, preview, controls, help."""
    tr = ctx.tr
    with tr.bind(gr.Tab(tr(f"tab_{mode}"), id=mode, elem_id=f"tab-{mode}"), label=f"tab_{mode}") as tab:
        tr.bind(gr.Markdown(tr(f"about_{mode}"), elem_classes="cosy-about"), value=f"about_{mode}")
        with gr.Row(equal_height=False):
            with gr.Column(scale=5, min_width=300):
                source = _source_inputs(mode, ctx)
            with gr.Column(scale=6, min_width=300):
                text_box, counter = _text_box(mode, ctx)
                results = _results(mode, tr)
                controls = _controls(mode, ctx)
                _help(mode, tr, text_box)
    return ModePanel(mode, tab, **source, text=text_box, counter=counter, **results, **controls)


def _source_inputs(mode: str, ctx: UiContext) -> dict[str, Any]:
    """The voice: a saved one, or a recording (checks, noise reduction) with what the mode adds to it."""
    tr, bridge = ctx.tr, ctx.bridge
    voice = tr.bind(
        gr.Dropdown(
            choices=voice_choices(bridge, tr.lang, None),  # filled per caller when the page loads
            value="",
            label=tr("saved_voice"),
            info=tr("saved_voice_info"),
            elem_id=f"{mode}-voice",
        ),
        label="saved_voice",
        info="saved_voice_info",
    )
    voice_note = gr.Markdown("", elem_id=f"{mode}-voice-note", elem_classes="cosy-note")
    prompt = tr.bind(
        gr.Audio(
            sources=["upload", "microphone"],
            type="filepath",
            label=tr("prompt_audio"),
            elem_id=f"{mode}-prompt",
        ),
        label="prompt_audio",
    )
    feedback = gr.Markdown("", elem_id=f"{mode}-feedback", elem_classes="cosy-feedback")
    statement, required = bridge.consent_statement
    need = "consent_needed" if required else "consent_optional"
    consent = tr.bind(
        gr.Checkbox(
            False, label=statement, info=tr("consent_recording", need=tr(need)), elem_id=f"{mode}-consent"
        ),
        info=lambda lang: text("consent_recording", lang, need=text(need, lang)),
    )
    parts = bridge.optional_parts()  # the switches below exist only for the parts installed here
    denoise: Any = gr.State(False)
    if parts["denoise"].installed:
        denoise = tr.bind(gr.Checkbox(False, label=tr("denoise"), elem_id=f"{mode}-denoise"), label="denoise")
    denoised = tr.bind(
        gr.Audio(
            type="filepath",
            interactive=False,
            visible=False,
            label=tr("denoised_audio"),
            elem_id=f"{mode}-denoised",
        ),
        label="denoised_audio",
    )
    found = _mode_inputs(mode, ctx, asr_ready=parts["asr"].installed)
    shown = [parts["denoise"], parts["asr"]] if mode == "zero_shot" else [parts["denoise"]]
    parts_note(tr, shown, f"{mode}-parts")
    return dict(
        voice=voice,
        voice_note=voice_note,
        prompt=prompt,
        feedback=feedback,
        denoise=denoise,
        consent=consent,
        denoised=denoised,
        **found,
    )


def _mode_inputs(mode: str, ctx: UiContext, asr_ready: bool) -> dict[str, Any]:
    """What a mode adds to the voice: the transcript (and its transcribe button), or the instruction."""
    tr = ctx.tr
    found: dict[str, Any] = {"transcript": gr.State(None), "transcribe": None}
    found.update(preset=gr.State(None), instruct=gr.State(None), instruct_note=gr.State(None))
    if mode == "zero_shot":
        found["transcript"] = tr.bind(
            gr.Textbox(
                label=tr("transcript"),
                placeholder=tr("transcript_ph"),
                lines=2,
                max_length=500,
                elem_id=f"{mode}-transcript",
            ),
            label="transcript",
            placeholder="transcript_ph",
        )
        if asr_ready:
            found["transcribe"] = tr.bind(
                gr.Button(tr("transcribe"), size="sm", elem_id=f"{mode}-transcribe"), value="transcribe"
            )
    if mode == "instruct":
        found["preset"] = tr.bind(
            gr.Dropdown(
                choices=preset_choices(tr.lang), value="", label=tr("preset"), elem_id=f"{mode}-preset"
            ),
            label="preset",
            choices=preset_choices,
        )
        found["instruct"] = tr.bind(
            gr.Textbox(
                label=tr("instruct_text"),
                placeholder=tr("instruct_ph"),
                max_length=500,
                elem_id=f"{mode}-instruct",
            ),
            label="instruct_text",
            placeholder="instruct_ph",
        )
        found["instruct_note"] = gr.Markdown("", elem_id=f"{mode}-instruct-note", elem_classes="cosy-note")
    return found


def _text_box(mode: str, ctx: UiContext) -> tuple[gr.Textbox, gr.HTML]:
    tr = ctx.tr
    text_box = tr.bind(
        gr.Textbox(
            label=tr("text"), placeholder=tr("text_ph"), lines=4, max_lines=12, elem_id=f"{mode}-text"
        ),
        label="text",
        placeholder="text_ph",
    )
    counter = gr.HTML(assets.counter_html(0, ctx.bridge.max_text_chars), elem_id=f"{mode}-counter")
    return text_box, counter


def _results(mode: str, tr: Translator) -> dict[str, Any]:
    """Generate, Cancel and Preview; the job progress bar, the result, its links and info, the preview."""
    with gr.Row(elem_classes="cosy-actions"):
        generate = tr.bind(
            gr.Button(tr("generate"), variant="primary", elem_id=f"{mode}-generate"), value="generate"
        )
        cancel = tr.bind(gr.Button(tr("cancel"), variant="stop", elem_id=f"{mode}-cancel"), value="cancel")
        preview_button = tr.bind(
            gr.Button(tr("preview_btn"), elem_id=f"{mode}-preview-btn"), value="preview_btn"
        )
    progress = gr.HTML("", elem_id=f"{mode}-progress")
    result = tr.bind(
        gr.Audio(
            type="filepath",
            interactive=False,
            label=tr("result"),
            buttons=["download"],
            elem_id=f"{mode}-result",
        ),
        label="result",
    )
    links = gr.HTML("", elem_id=f"{mode}-links")
    info = gr.Markdown("", elem_id=f"{mode}-info")
    with tr.bind(
        gr.Accordion(tr("preview_title"), open=True, elem_id=f"{mode}-preview-box"), label="preview_title"
    ):
        preview = gr.HTML("", elem_id=f"{mode}-preview")
    stream_box = gr.Textbox("", visible="hidden", elem_id=f"{mode}-stream-box")
    click = gr.Textbox("", visible="hidden", elem_id=f"{mode}-click")  # each Generate click's token
    return dict(
        click=click,
        generate=generate,
        cancel=cancel,
        preview_button=preview_button,
        progress=progress,
        result=result,
        links=links,
        info=info,
        preview=preview,
        stream_box=stream_box,
    )


def _controls(mode: str, ctx: UiContext) -> dict[str, Any]:
    """Seed (with a dice), speed, volume, takes (from the server's default), streaming."""
    tr, bridge = ctx.tr, ctx.bridge
    with gr.Row(equal_height=True):
        seed = tr.bind(
            gr.Textbox(
                value="", label=tr("seed"), placeholder=tr("seed_ph"), max_length=10, elem_id=f"{mode}-seed"
            ),
            label="seed",
            placeholder="seed_ph",
        )
        dice = gr.Button(tr("dice"), elem_classes="cosy-dice", elem_id=f"{mode}-dice")
    with gr.Row():
        speed = tr.bind(
            gr.Slider(MIN_SPEED, MAX_SPEED, value=1.0, step=0.05, label=tr("speed"), elem_id=f"{mode}-speed"),
            label="speed",
        )
        volume = tr.bind(
            gr.Slider(0.1, 2.0, value=1.0, step=0.05, label=tr("volume"), elem_id=f"{mode}-volume"),
            label="volume",
        )
    takes = tr.bind(
        gr.Slider(
            1,
            bridge.max_takes,
            value=bridge.default_takes,
            step=1,
            label=tr("takes"),
            elem_id=f"{mode}-takes",
        ),
        label="takes",
    )
    stream = tr.bind(
        gr.Checkbox(value=True, label=tr("stream"), info=tr("stream_info"), elem_id=f"{mode}-stream"),
        label="stream",
        info="stream_info",
    )
    return dict(seed=seed, dice=dice, speed=speed, volume=volume, takes=takes, stream=stream)


def _help(mode: str, tr: Translator, text_box: gr.Textbox) -> None:
    with tr.bind(gr.Accordion(tr("help_title"), open=False, elem_id=f"{mode}-help"), label="help_title"):
        tr.bind(gr.Markdown(HELP[tr.lang]), value=lambda lang: HELP[lang])
    examples = gr.Examples([[t] for t in EXAMPLES[mode]], inputs=[text_box], label=tr("examples"))
    tr.bind(examples.dataset, label="examples")
