"""The three synthesis tabs (zero-shot clone, cross-lingual, instruct): one builder, one panel per mode."""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from cosyserve.errors import InputError
from cosyserve.frontend.text.presets import INSTRUCT_PRESETS
from cosyserve.ui import assets
from cosyserve.ui.bridge import DOWNLOAD_FORMATS, UiBridge
from cosyserve.ui.generate import Form, TicketRegistry, error_message, run_synthesis
from cosyserve.ui.i18n import Translator, text

HELP = {
    "zh": """
| 写法 | 作用 |
| --- | --- |
| `[h][ào]` | 按拼音（带声调）读单个字：`爱好[h][ào]` |
| `[重庆][chóng qìng]` | 整词指定读音（自动转换为拼音标记） |
| `[M][AY0][N][UW1][T]` | 英文单词用 CMU 音素指定读音 |
| `[breath]` `[laughter]` `[cough]` `[sigh]` | 在该处插入呼吸、笑声、咳嗽、叹气 |
| `<strong>重点</strong>` | 强调一段文字 |

日语会自动转换为片假名；长文本按句切分，逐句生成。""",
    "en": """
| Write | Effect |
| --- | --- |
| `[h][ào]` | read one character with this pinyin (with tone): `爱好[h][ào]` |
| `[重庆][chóng qìng]` | give a whole word's pronunciation (converted to pinyin marks) |
| `[M][AY0][N][UW1][T]` | an English word's pronunciation as CMU phonemes |
| `[breath]` `[laughter]` `[cough]` `[sigh]` | a breath, laughter, cough or sigh at that point |
| `<strong>word</strong>` | stress a passage |

Japanese is converted to katakana; long texts are split into sentences and spoken one by one.""",
}

EXAMPLES = {
    "zero_shot": [
        "你好，欢迎使用语音合成工作室。",
        "收到好友从远方寄来的生日礼物，那份意外的惊喜让我心中充满了快乐[laughter]。",
        "周末我们一起去[重庆][chóng qìng]吃火锅吧。",
        "Hello! [breath] This voice was cloned from a three second recording.",
    ],
    "cross_lingual": [
        "Hello, nice to meet you. I learned English from a Chinese recording.",
        "こんにちは、今日はいい天気ですね。",
        "Let me read the word [M][AY0][N][UW1][T] for you.",
    ],
    "instruct": [
        "今天天气真不错，我们出去走走吧。",
        "我真的没想到你会来，太让人惊喜了！",
        "The meeting starts at nine, please don't be late.",
    ],
}

GROUP_KEYS = {
    "dialect": "group_dialect",
    "emotion": "group_emotion",
    "speed": "group_speed",
    "volume": "group_volume",
    "role": "group_role",
}


def preset_choices(lang: str) -> list[tuple[str, str]]:
    """(label, preset id) pairs, grouped by kind, with a "no preset" entry first."""
    choices = [(text("preset_none", lang), "")]
    for preset in INSTRUCT_PRESETS:
        group = text(GROUP_KEYS.get(preset.id.split(":")[0], "preset"), lang)
        label = preset.label_zh if lang == "zh" else preset.label_en
        choices.append((f"{group} · {label}", preset.id))
    return choices


def voice_choices(bridge: UiBridge, lang: str) -> list[tuple[str, str]]:
    return [(text("no_voice", lang), "")] + [(voice.name, voice.id) for voice in bridge.voices()]


def prompt_feedback(bridge: UiBridge, path: str | None, lang: str) -> str:
    """Markdown telling whether a prompt recording is usable, with its duration and level."""
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
    if report.warnings:
        notes = "".join(f"\n- {html.escape(w)}" for w in report.warnings)
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
RUN_FIELDS = ("voice", "prompt", "transcript", "preset", "instruct", "text", "seed", "speed", "volume", "fmt",
              "stream")  # fmt: skip


@dataclass
class ModePanel:
    mode: str
    tab: Any
    voice: gr.Dropdown
    prompt: gr.Audio
    feedback: gr.Markdown
    transcript: Any  # gr.Textbox, or a State placeholder in modes without one
    preset: Any
    instruct: Any
    text: gr.Textbox
    seed: gr.Textbox
    speed: gr.Slider
    volume: gr.Slider
    fmt: gr.Radio
    stream: gr.Checkbox
    generate: gr.Button
    cancel: gr.Button
    result: gr.Audio
    links: gr.HTML
    info: gr.Markdown
    stream_box: gr.Textbox
    run_fn: Callable[..., Any] | None = None  # run(lang, request, progress, **{RUN_FIELDS: values})
    run_event: Any = None  # the Generate click, for chaining

    @property
    def run_inputs(self) -> dict[str, Any]:
        """The synthesis inputs as Gradio `inputs_kwargs` (the callback gets them by name)."""
        return {name: getattr(self, name) for name in RUN_FIELDS}

    @property
    def run_outputs(self) -> list[Any]:
        return [self.result, self.links, self.info, self.stream_box]


def build_mode_panel(mode: str, ctx: UiContext) -> ModePanel:
    """One mode's tab: voice source, mode inputs, text and controls, Generate/Cancel and the result."""
    tr = ctx.tr
    with tr.bind(gr.Tab(tr(f"tab_{mode}"), id=mode, elem_id=f"tab-{mode}"), label=f"tab_{mode}") as tab:
        tr.bind(gr.Markdown(tr(f"about_{mode}")), value=f"about_{mode}")
        with gr.Row(equal_height=False):
            with gr.Column(scale=5):
                source = _source_inputs(mode, ctx)
            with gr.Column(scale=6):
                text_box, counter = _text_inputs(mode, ctx)
                controls = _controls(mode, tr)
                results = _results(mode, tr)
    panel = ModePanel(mode, tab, *source, text_box, *controls[:-1], *results)
    _wire(panel, ctx, counter, controls[-1])
    return panel


def _source_inputs(mode: str, ctx: UiContext) -> tuple[Any, ...]:
    """(voice, prompt, feedback, transcript, preset, instruct): the voice and what the mode adds to it."""
    tr, bridge = ctx.tr, ctx.bridge
    voice = tr.bind(
        gr.Dropdown(
            choices=voice_choices(bridge, tr.lang),
            value="",
            label=tr("saved_voice"),
            info=tr("saved_voice_info"),
            elem_id=f"{mode}-voice",
        ),
        label="saved_voice",
        info="saved_voice_info",
        choices=lambda lang: voice_choices(bridge, lang),
    )
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
    transcript: Any = gr.State(None)
    preset: Any = gr.State(None)
    instruct: Any = gr.State(None)
    if mode == "zero_shot":
        transcript = tr.bind(
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
    if mode == "instruct":
        preset = tr.bind(
            gr.Dropdown(
                choices=preset_choices(tr.lang), value="", label=tr("preset"), elem_id=f"{mode}-preset"
            ),
            label="preset",
            choices=preset_choices,
        )
        instruct = tr.bind(
            gr.Textbox(
                label=tr("instruct_text"),
                placeholder=tr("instruct_ph"),
                max_length=500,
                elem_id=f"{mode}-instruct",
            ),
            label="instruct_text",
            placeholder="instruct_ph",
        )
    return voice, prompt, feedback, transcript, preset, instruct


def _text_inputs(mode: str, ctx: UiContext) -> tuple[gr.Textbox, gr.HTML]:
    """The text box with its character counter, the syntax help and the examples."""
    tr = ctx.tr
    text_box = tr.bind(
        gr.Textbox(label=tr("text"), placeholder=tr("text_ph"), lines=4, elem_id=f"{mode}-text"),
        label="text",
        placeholder="text_ph",
    )
    counter = gr.HTML(assets.counter_html(0, ctx.bridge.max_text_chars), elem_id=f"{mode}-counter")
    with tr.bind(gr.Accordion(tr("help_title"), open=False), label="help_title"):
        tr.bind(gr.Markdown(HELP[tr.lang]), value=lambda lang: HELP[lang])
    examples = gr.Examples([[t] for t in EXAMPLES[mode]], inputs=[text_box], label=tr("examples"))
    tr.bind(examples.dataset, label="examples")
    return text_box, counter


def _controls(mode: str, tr: Translator) -> tuple[Any, ...]:
    """(seed, speed, volume, format, stream, dice button)."""
    with gr.Row():
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
            gr.Slider(0.5, 2.0, value=1.0, step=0.05, label=tr("speed"), elem_id=f"{mode}-speed"),
            label="speed",
        )
        volume = tr.bind(
            gr.Slider(0.1, 2.0, value=1.0, step=0.05, label=tr("volume"), elem_id=f"{mode}-volume"),
            label="volume",
        )
    with gr.Row():
        fmt = tr.bind(
            gr.Radio(list(DOWNLOAD_FORMATS), value="wav", label=tr("format"), elem_id=f"{mode}-format"),
            label="format",
        )
        stream = tr.bind(
            gr.Checkbox(value=True, label=tr("stream"), elem_id=f"{mode}-stream"), label="stream"
        )
    return seed, speed, volume, fmt, stream, dice


def _results(mode: str, tr: Translator) -> tuple[Any, ...]:
    """(Generate, Cancel, result audio, download links, info, the hidden box the page streams from)."""
    with gr.Row():
        generate = tr.bind(
            gr.Button(tr("generate"), variant="primary", elem_id=f"{mode}-generate"), value="generate"
        )
        cancel = tr.bind(gr.Button(tr("cancel"), variant="stop", elem_id=f"{mode}-cancel"), value="cancel")
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
    stream_box = gr.Textbox("", visible="hidden", elem_id=f"{mode}-stream-box")
    return generate, cancel, result, links, info, stream_box


def _wire(panel: ModePanel, ctx: UiContext, counter: gr.HTML, dice: gr.Button) -> None:
    bridge, registry = ctx.bridge, ctx.registry
    mode = panel.mode

    def feedback(path: str | None, lang: str) -> str:
        return prompt_feedback(bridge, path, lang)

    def run(
        lang: str,
        request: gr.Request,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 - Gradio finds its tracker by this default
        **values: Any,
    ) -> Any:
        form = Form(mode, **values)
        yield from run_synthesis(bridge, registry, form, lang, request, progress, ctx.cache_dir)

    def cancel(lang: str, request: gr.Request) -> str:
        registry.cancel(getattr(request, "session_hash", None) or "")
        return text("cancelled", lang)

    panel.run_fn = run
    panel.prompt.change(feedback, [panel.prompt, ctx.lang], [panel.feedback], show_progress="hidden")
    panel.text.change(None, [panel.text], [counter], js=assets.counter_js(ctx.bridge.max_text_chars))
    dice.click(None, None, [panel.seed], js=assets.DICE_JS)
    panel.generate.click(None, None, None, js=assets.UNLOCK_JS)
    run_event = panel.generate.click(
        run,
        [ctx.lang],
        panel.run_outputs,
        inputs_kwargs=panel.run_inputs,
        concurrency_limit=ctx.concurrency_limit,
        concurrency_id="synthesis",
        show_progress="full",
    )
    panel.run_event = run_event
    panel.stream_box.change(None, [panel.stream_box], None, js=assets.FEED_JS)
    panel.cancel.click(cancel, [ctx.lang], [panel.info], js=assets.STOP_JS, cancels=[run_event], queue=False)
