"""Mode assembly and the whole text frontend: what the LM reads for each kind of request."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosyserve.errors import InputError
from cosyserve.frontend.text import (
    INSTRUCT_PRESETS,
    SYSTEM_PREFIX,
    Lexicon,
    assemble_lm_texts,
    check_length,
    find_preset,
    leading_tag_instruction,
    prepare_texts,
    resolve_instruction,
    strip_system_markers,
)
from cosyserve.frontend.tokenizer import TextTokenizer

ENDOFPROMPT_ID = 151646
TRANSCRIPT = "希望你以后能够做的比我还好呦。"
TONGUE_TWISTER = "八百标兵奔北坡，北坡炮兵并排跑，炮兵怕把标兵碰，标兵怕碰炮兵炮。"


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_dir / "model")


def _endofprompt_count(tokenizer: TextTokenizer, text: str) -> int:
    return tokenizer.encode(text).count(ENDOFPROMPT_ID)


@pytest.mark.parametrize(
    "prompt_text",
    [TRANSCRIPT, f"You are a helpful assistant.<|endofprompt|>{TRANSCRIPT}", f"<|endofprompt|>{TRANSCRIPT}"],
)
def test_zero_shot(tokenizer: TextTokenizer, prompt_text: str) -> None:
    prepared = prepare_texts(TONGUE_TWISTER, tokenizer=tokenizer, prompt_text=prompt_text)
    assert prepared.mode == "zero_shot"
    assert prepared.use_prompt_speech_tokens
    assert prepared.lm_prompt_text == f"You are a helpful assistant.<|endofprompt|>{TRANSCRIPT}"
    assert prepared.segments == prepared.display_segments == [TONGUE_TWISTER]
    assert prepared.instruction is None
    assert _endofprompt_count(tokenizer, prepared.lm_prompt_text) == 1
    assert all(_endofprompt_count(tokenizer, segment) == 0 for segment in prepared.segments)


def test_zero_shot_transcript_is_normalised(tokenizer: TextTokenizer) -> None:
    prepared = prepare_texts(TONGUE_TWISTER, tokenizer=tokenizer, prompt_text="我今年25岁")
    assert prepared.lm_prompt_text == "You are a helpful assistant.<|endofprompt|>我今年二十五岁"


FINE_GRAINED = (
    "[breath]因为他们那一辈人[breath]在乡里面住的要习惯一点，"
    "[breath]邻居都很活络，[breath]嗯，都很熟悉。[breath]"
)


@pytest.mark.parametrize(
    "typed", [FINE_GRAINED, f"You are a helpful assistant.<|endofprompt|>{FINE_GRAINED}"]
)
def test_cross_lingual_prefixes_every_segment_once(tokenizer: TextTokenizer, typed: str) -> None:
    prepared = prepare_texts(typed, tokenizer=tokenizer)
    assert prepared.mode == "cross_lingual"
    assert not prepared.use_prompt_speech_tokens
    assert prepared.lm_prompt_text == ""
    assert prepared.display_segments == [FINE_GRAINED]
    assert prepared.segments == [SYSTEM_PREFIX + FINE_GRAINED]
    ids = tokenizer.encode(prepared.segments[0])
    assert ids.count(ENDOFPROMPT_ID) == 1
    assert ids.count(tokenizer.token_to_id("[breath]")) == 5


def test_cross_lingual_long_text_every_segment_has_the_prefix(tokenizer: TextTokenizer) -> None:
    text = "今天天气很好，我们一起去公园散步吧。" * 8
    prepared = prepare_texts(text, tokenizer=tokenizer, max_chars=None)
    assert len(prepared.segments) > 1
    for segment, shown in zip(prepared.segments, prepared.display_segments, strict=True):
        assert segment == SYSTEM_PREFIX + shown
        assert _endofprompt_count(tokenizer, segment) == 1


CANTONESE = "You are a helpful assistant. 请用广东话表达。<|endofprompt|>"


@pytest.mark.parametrize(
    "instruct", ["dialect:cantonese", "广东话", "Cantonese", "请用广东话表达。", "请用广东话表达", CANTONESE]
)
def test_instruct(tokenizer: TextTokenizer, instruct: str) -> None:
    text = "好少咯，一般系放嗰啲国庆啊，中秋嗰啲可能会咯。"
    prepared = prepare_texts(text, tokenizer=tokenizer, instruct=instruct, prompt_text=TRANSCRIPT)
    assert prepared.mode == "instruct"
    assert not prepared.use_prompt_speech_tokens
    assert prepared.lm_prompt_text == CANTONESE
    assert prepared.instruction == "请用广东话表达。"
    assert prepared.segments == [text]
    assert _endofprompt_count(tokenizer, prepared.lm_prompt_text) == 1
    assert _endofprompt_count(tokenizer, prepared.segments[0]) == 0


def test_free_text_instruction_gets_final_punctuation() -> None:
    assert resolve_instruction("  Speak like a pirate ") == "Speak like a pirate."
    assert resolve_instruction("用播音员的语气") == "用播音员的语气。"
    typed = "You are a helpful assistant. 请像老师一样！<|endofprompt|>"
    assert resolve_instruction(typed) == "请像老师一样！"
    assert resolve_instruction("   ") is None


@pytest.mark.parametrize(
    ("typed", "preset_wording"),
    [
        ("请用四川话说", "请用四川话表达。"),
        ("用四川话讲。", "请用四川话表达。"),
        ("Please speak in Cantonese", "请用广东话表达。"),
        ("请开心地说", "请非常开心地说一句话。"),
        ("请快一点！", "请用尽可能快地语速说一句话。"),
    ],
)
def test_paraphrase_of_a_preset_becomes_its_trained_wording(
    tokenizer: TextTokenizer, typed: str, preset_wording: str
) -> None:
    assert resolve_instruction(typed) == preset_wording
    prepared = prepare_texts("今天天气不错。", tokenizer=tokenizer, instruct=typed)
    assert prepared.instruction == preset_wording
    assert any(preset_wording in warning for warning in prepared.warnings)  # shown to the user


def test_free_instruction_that_is_no_paraphrase_is_kept() -> None:
    assert resolve_instruction("说四川话的时候要慢") == "说四川话的时候要慢。"
    assert resolve_instruction("请用温柔的语气慢慢地说。") == "请用温柔的语气慢慢地说。"


def test_instruction_typed_into_the_text(tokenizer: TextTokenizer) -> None:
    prepared = prepare_texts(
        "You are a helpful assistant. 请用四川话表达。<|endofprompt|>吃了吗", tokenizer=tokenizer
    )
    assert prepared.mode == "instruct"
    assert prepared.lm_prompt_text == "You are a helpful assistant. 请用四川话表达。<|endofprompt|>"
    assert prepared.segments == ["吃了吗。"]


def test_instruction_typed_into_the_transcript(tokenizer: TextTokenizer) -> None:
    prepared = prepare_texts(TONGUE_TWISTER, tokenizer=tokenizer, prompt_text=CANTONESE)
    assert (prepared.mode, prepared.lm_prompt_text) == ("instruct", CANTONESE)


@pytest.mark.parametrize(
    ("text", "instruction", "spoken"),
    [
        ("[兴奋]请开始你的表演", "请非常兴奋地说一句话。", "请开始你的表演。"),
        ("[开心]今天真好", "请非常开心地说一句话。", "今天真好。"),
        ("[sad] I lost it", "请非常伤心地说一句话。", "I lost it."),
        ("[Angry] Stop", "请非常生气地说一句话。", "Stop."),
        ("[whisper] quiet now", "Please say a sentence in a very soft voice.", "quiet now."),
        ("[四川话]吃了吗", "请用四川话表达。", "吃了吗。"),
        ("[cheerful] Hello there", "Please speak in a cheerful tone.", "Hello there."),
        ("[慢慢地]走吧", "请慢慢地说一句话。", "走吧。"),
        ("[用播音员的语气]新闻开始", "用播音员的语气。", "新闻开始。"),
    ],
)
def test_leading_tag_becomes_the_instruction(
    tokenizer: TextTokenizer, text: str, instruction: str, spoken: str
) -> None:
    prepared = prepare_texts(text, tokenizer=tokenizer, prompt_text=TRANSCRIPT)
    assert prepared.mode == "instruct"
    assert prepared.instruction == instruction
    assert prepared.lm_prompt_text == f"You are a helpful assistant. {instruction}<|endofprompt|>"
    assert prepared.segments == [spoken]


@pytest.mark.parametrize(
    "text", ["[breath]你好", "[重庆]是山城", "[注]见下文", "[重庆][chóng qìng]到了", "[1] one"]
)
def test_leading_brackets_that_are_not_instructions(text: str) -> None:
    assert leading_tag_instruction(text) == (None, text)


def test_explicit_instruction_wins_over_a_tag(tokenizer: TextTokenizer) -> None:
    prepared = prepare_texts("[sad]今天真好", tokenizer=tokenizer, instruct="emotion:happy")
    assert prepared.instruction == "请非常开心地说一句话。"
    assert prepared.segments == ["今天真好。"]
    assert any("ignored" in warning for warning in prepared.warnings)


def test_fine_grained_tags_pass_through(tokenizer: TextTokenizer) -> None:
    text = "他说<strong>真的</strong>[laughter]，然后[cough]走了<laughter>哈哈</laughter>。[sigh]"
    prepared = prepare_texts(text, tokenizer=tokenizer, prompt_text=TRANSCRIPT)
    assert prepared.segments == [text]
    ids = tokenizer.encode(prepared.segments[0])
    for tag in ("<strong>", "</strong>", "[laughter]", "[cough]", "<laughter>", "</laughter>", "[sigh]"):
        assert ids.count(tokenizer.token_to_id(tag)) == 1


def test_chat_markers_are_removed() -> None:
    assert strip_system_markers("<|im_start|>你好<|im_end|>") == "你好"
    assert strip_system_markers("You are a helpful assistant.<|endofprompt|>hi") == "hi"
    assert strip_system_markers("you are a helpful assistant。你好") == "你好"


def test_assemble_lm_texts_modes() -> None:
    zero_shot = assemble_lm_texts(["a."], prompt_transcript="b.")
    assert (zero_shot.prompt_text, zero_shot.texts, zero_shot.mode) == (
        SYSTEM_PREFIX + "b.",
        ["a."],
        "zero_shot",
    )
    instruct = assemble_lm_texts(["a."], prompt_transcript="b.", instruction="请快一点。")
    assert instruct.prompt_text == "You are a helpful assistant. 请快一点。<|endofprompt|>"
    assert (instruct.use_prompt_speech_tokens, instruct.mode) == (False, "instruct")
    cross = assemble_lm_texts(["a.", "b."])
    assert (cross.prompt_text, cross.texts, cross.mode) == (
        "",
        [SYSTEM_PREFIX + "a.", SYSTEM_PREFIX + "b."],
        "cross_lingual",
    )


def test_short_text_warning_in_zero_shot(tokenizer: TextTokenizer) -> None:
    prepared = prepare_texts("好。", tokenizer=tokenizer, prompt_text=TRANSCRIPT)
    assert len(prepared.warnings) == 1 and "half" in prepared.warnings[0]
    assert not prepare_texts(TONGUE_TWISTER, tokenizer=tokenizer, prompt_text=TRANSCRIPT).warnings


def test_presets() -> None:
    dialects = [preset for preset in INSTRUCT_PRESETS if preset.id.startswith("dialect:")]
    assert len(dialects) == 17
    names = ("广东", "东北", "甘肃", "贵州", "河南", "湖北", "湖南", "江西", "闽南")
    names += ("宁夏", "山西", "陕西", "山东", "上海", "四川", "天津", "云南")
    assert [preset.label_zh for preset in dialects] == [f"{name}话" for name in names]
    assert [preset.instruction for preset in dialects] == [f"请用{name}话表达。" for name in names]
    assert len({preset.id for preset in INSTRUCT_PRESETS}) == len(INSTRUCT_PRESETS)
    for preset in INSTRUCT_PRESETS:
        assert preset.label_zh and preset.label_en and preset.instruction[-1] in "。.？"
        assert find_preset(preset.id) is preset
    assert find_preset("speed:fast").instruction == "请用尽可能快地语速说一句话。"
    assert find_preset("loud").instruction == "Please say a sentence as loudly as possible."
    assert find_preset("伤心").instruction == "请非常伤心地说一句话。"
    assert find_preset("四川话").instruction == "请用四川话表达。"


def test_length_limit(tokenizer: TextTokenizer) -> None:
    check_length("字" * 200)
    with pytest.raises(
        InputError,
        match=r"text is 201 characters, the limit is 200: split it, send a longer text as a job \(POST",
    ):
        check_length("字" * 201)
    with pytest.raises(InputError, match="text is 201 characters"):
        prepare_texts("字" * 201, tokenizer=tokenizer)
    # The system sentence that users copy from the examples does not count.
    prepare_texts(SYSTEM_PREFIX + "字" * 200, tokenizer=tokenizer)
    prepare_texts("字" * 300, tokenizer=tokenizer, max_chars=None)


@pytest.mark.parametrize("text", ["", "   ", "。。。", "You are a helpful assistant.<|endofprompt|>", "!?"])
def test_nothing_to_speak(tokenizer: TextTokenizer, text: str) -> None:
    with pytest.raises(InputError):
        prepare_texts(text, tokenizer=tokenizer)


def test_only_a_tag_is_spoken(tokenizer: TextTokenizer) -> None:
    assert prepare_texts("[laughter]", tokenizer=tokenizer).display_segments == ["[laughter]"]


def test_pronunciation_lexicon_and_japanese_end_to_end(tokenizer: TextTokenizer) -> None:
    lexicon = Lexicon({"行长": "hang2 zhang3"})
    prepared = prepare_texts("[重庆](chóng qìng)的行长说[j][ǐ]予好评。", tokenizer=tokenizer, lexicon=lexicon)
    assert prepared.display_segments == ["[ch][óng][q][ìng]的[h][áng][zh][ǎng]说[j][ǐ]予好评。"]
    as_dict = prepare_texts("行长", tokenizer=tokenizer, lexicon={"行长": "hang2 zhang3"}).display_segments
    assert as_dict == ["[h][áng][zh][ǎng]。"]
    japanese = prepare_texts("私は学生です。", tokenizer=tokenizer).display_segments
    assert japanese == ["ワタシ ワ ガクセイ デス。"]


def test_written_segments_show_words_not_tokens(tokenizer: TextTokenizer) -> None:
    """Subtitles and timings show what the user wrote: the word of a word form or lexicon entry, the
    syllable of a bare pinyin token, never the LM's bracketed tokens (issue 18, bug 2)."""
    lexicon = {"行长": "hang2 zhang3"}
    prepared = prepare_texts("[重庆](chóng qìng)的行长说[j][ǐ]予好评。", tokenizer=tokenizer, lexicon=lexicon)
    assert prepared.written_segments == ["重庆的行长说jǐ予好评。"]
    joined = prepare_texts("[重庆][chóng qìng][火锅][huǒ guō]", tokenizer=tokenizer).written_segments
    assert joined == ["重庆火锅"]  # as typed: the 。 the split adds is not shown
    english = prepare_texts("Read [M][AY0][N][UW1][T] now.", tokenizer=tokenizer).written_segments
    assert english == ["Read M AY0 N UW1 T now."]
    assert prepare_texts("[laughter]好", tokenizer=tokenizer).written_segments == ["[laughter]好"]


def test_written_segments_are_the_typed_text_not_the_spoken_form(tokenizer: TextTokenizer) -> None:
    """Subtitles show what was typed (`第2课`, `¥12.50`), not how it is read (issue 29)."""
    prepared = prepare_texts("第2课：你好", tokenizer=tokenizer)
    assert prepared.display_segments == ["第二课：你好。"]
    assert prepared.written_segments == ["第2课：你好"]
    sentence = "第2课的内容很长很长，我们要学习很多很多的东西，包括2本书和12个生字，一共需要¥12.50的费用。"
    prepared = prepare_texts(sentence * 3 + "最后一句。", tokenizer=tokenizer, max_chars=None)
    assert len(prepared.display_segments) == 2 and "十二点五元" in prepared.display_segments[0]
    assert prepared.written_segments == [sentence * 2, sentence + "最后一句。"]
    english = prepare_texts("It costs $12.50. Room No. 5 is there. Pi is 3.14, ok.", tokenizer=tokenizer)
    assert "".join(english.written_segments) == "It costs $12.50. Room No. 5 is there. Pi is 3.14, ok."


def test_typed_text_follows_a_lexicon_and_the_whole_texts_language(tokenizer: TextTokenizer) -> None:
    lexicon = {"行长": "hang2 zhang3"}
    prepared = prepare_texts("行长说：I have 2 books.", tokenizer=tokenizer, lexicon=lexicon)
    assert prepared.written_segments == ["行长说：I have 2 books."]
    lines = prepare_texts("第一行\n\n第二行，2个人", tokenizer=tokenizer).written_segments
    assert lines == ["第一行 第二行，2个人"]  # no blank line inside a subtitle cue


def test_unknown_phone_is_an_input_error(tokenizer: TextTokenizer) -> None:
    with pytest.raises(InputError, match=r"\[zhong4\].*e\.g\."):
        prepare_texts("我在[zhong4]庆", tokenizer=tokenizer)
