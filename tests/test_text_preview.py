"""The text preview, computed by the service (`service.text_preview`) and only rendered by the UI
(`ui/preview.py`): the spoken text cut into plain words, pronunciation tokens and tags, the fields of each
synthesis tab turned into the reading's inputs, saved voices, and the sentence count of a long text."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from cosyserve.errors import InputError
from cosyserve.frontend.tokenizer import TextTokenizer
from cosyserve.service.access.principals import AuthRequired
from cosyserve.service.text_preview import (
    PLAIN,
    PRONUNCIATION,
    TAG,
    ReadingFields,
    Span,
    reading_inputs,
    sentence_total,
    spans,
    text_preview,
)
from cosyserve.ui.preview import form_preview, highlight, preview_html


@pytest.fixture(scope="module")
def service(tiny_dir: Path) -> SimpleNamespace:
    """What the preview reads of a `Service`: the loaded model's tokenizer, the voices, the text limit."""
    tokenizer = TextTokenizer.from_dir(tiny_dir / "model" / "CosyVoice-BlankEN")
    saved = SimpleNamespace(
        transcript="希望你以后能够做的比我还好呦。", defaults=SimpleNamespace(instruct=None), lexicon={}
    )
    return SimpleNamespace(
        model=SimpleNamespace(loaded=SimpleNamespace(tokenizer=tokenizer)),
        voices=SimpleNamespace(get=lambda id_or_name, may_use: saved),
        settings=SimpleNamespace(limits=SimpleNamespace(max_text_chars=20)),
    )


def test_spans_tell_pronunciations_from_tags_and_render_escaped() -> None:
    cut = spans("去[ch][óng]<b>&[breath]")
    assert cut == (
        Span("去", PLAIN),
        Span("[ch]", PRONUNCIATION),
        Span("[óng]", PRONUNCIATION),
        Span("<b>", TAG),
        Span("&", PLAIN),
        Span("[breath]", TAG),
    )
    assert highlight(cut) == (
        '去<mark class="cosy-pron">[ch]</mark><mark class="cosy-pron">[óng]</mark>'
        '<mark class="cosy-tag">&lt;b&gt;</mark>&amp;<mark class="cosy-tag">[breath]</mark>'
    )
    assert spans("") == ()


@pytest.mark.parametrize(
    ("mode", "fields", "expected"),
    [
        ("zero_shot", {"transcript": " 你好。 "}, ("你好。", None)),
        ("zero_shot", {"transcript": ""}, ("…", None)),  # transcript still missing: zero-shot anyway
        ("zero_shot", {"voice": "v1", "transcript": "ignored"}, (None, None)),  # the voice's own
        ("cross_lingual", {"transcript": "你好。", "instruct": "ignored"}, ("", None)),
        ("instruct", {"instruct": " 说慢一点 ", "preset": "用开心的语气"}, (None, "说慢一点")),
        ("instruct", {"instruct": "", "preset": "用开心的语气"}, (None, "用开心的语气")),
    ],
)
def test_reading_inputs_follow_each_tab(mode, fields, expected) -> None:
    assert reading_inputs(ReadingFields(mode, **fields)) == expected


def test_the_preview_shows_the_spoken_form_and_renders_as_html(service) -> None:
    text, fields = (
        "我花了12.5元去[重庆][chóng qìng]买iPhone。",
        ReadingFields("zero_shot", transcript="你好。"),
    )
    preview = text_preview(service, None, text, fields)
    assert preview.mode == "zero_shot"
    assert "十二点五元" in "".join(span.text for span in preview.spoken)
    assert any(span.kind == PRONUNCIATION for span in preview.spoken)
    assert len(preview.lm_pieces) == len(preview.segments) >= 1
    html = preview_html(preview, "en")
    assert "十二点五元" in html and '<mark class="cosy-pron">[ch]</mark>' in html


def test_a_saved_voice_needs_a_principal_and_lends_its_transcript(service) -> None:
    with pytest.raises(AuthRequired):
        text_preview(service, None, "你好。", ReadingFields("zero_shot", voice="v1"))
    principal = SimpleNamespace(voices=None)
    assert (
        text_preview(service, principal, "你好。", ReadingFields("zero_shot", voice="v1")).mode == "zero_shot"
    )


def test_no_model_is_a_clear_input_error_and_the_ui_shows_it(service) -> None:
    idle = SimpleNamespace(model=None)
    with pytest.raises(InputError, match="needs the model loaded"):
        text_preview(idle, None, "你好。", ReadingFields("cross_lingual"))
    bridge = SimpleNamespace(
        text_preview=lambda principal, words, fields, **_: text_preview(idle, principal, words, fields)
    )
    form = SimpleNamespace(
        text="你好。", mode="cross_lingual", voice=None, transcript=None, instruct=None, preset=None
    )
    assert "needs the model loaded" in form_preview(bridge, None, form, "en")
    assert form_preview(bridge, None, SimpleNamespace(text="  ", mode="zero_shot"), "en") == ""


def test_a_long_text_counts_the_sentences_of_every_piece(service) -> None:
    text = "第一句话。第二句话。第三句话。第四句话。第五句话。第六句话。"
    pieces = 2  # 20 characters at most each
    assert sentence_total(service, text) >= pieces
    assert sentence_total(SimpleNamespace(model=None, settings=service.settings), text) == pieces  # one each


def sentence_list(html: str) -> str:
    return html.split("<ol class='cosy-sentences'")[1].split("</ol>")[0]


LONG = "".join(f"这是第{n}句话，它讲了一件很长很长的事情，一直讲到天黑才讲完。" for n in range(1, 9))


def test_a_results_timings_pair_with_its_own_sentences(service) -> None:
    """A request's sentences are the preview's: each gets its time, the rest "later" for a result stopped
    midway."""
    preview = text_preview(service, None, LONG, ReadingFields("cross_lingual"), with_written=True)
    assert preview.written is not None and len(preview.written) == len(preview.segments) >= 2
    timings = [{"index": 0, "text": preview.written[0], "start_s": 0.0, "end_s": 1.25}]
    html = preview_html(preview, "en", timings)
    assert "0.00–1.25 s" in html and "(timing after generating)" in html and "data-from" not in html
    assert sentence_list(html).count("<li>") == len(preview.segments)


def test_a_long_jobs_timings_are_shown_as_the_job_split_them(service) -> None:
    """A long text's job splits each piece on its own: its sentences are not the whole text's, so the
    preview lists the result's own sentences with their times (it paired the whole text's sentences
    with other sentences' times), a timing without text extending the one before."""
    preview = text_preview(service, None, LONG, ReadingFields("cross_lingual"), with_written=True)
    first, rest = LONG[:30], LONG[30:]
    timings = [
        {"index": 0, "text": first, "start_s": 0.0, "end_s": 3.0},
        {"index": 1, "text": rest, "start_s": 3.0, "end_s": 9.5},
        {"index": 2, "text": "", "start_s": 9.5, "end_s": 9.75},
    ]
    html = preview_html(preview, "en", timings)
    assert "data-from='result'" in html and sentence_list(html).count("<li>") == 2 and "Sentences (2)" in html
    assert f"{first} <span class='cosy-when'>0.00–3.00 s" in html
    assert f"{rest} <span class='cosy-when'>3.00–9.75 s" in html
