"""Text normalisation (wetext + the official cleanups) and splitting into LM segments."""

from __future__ import annotations

import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cosyserve.frontend.text import normalize_text, short_text_warning, split_text, text_language
from cosyserve.frontend.text.normalize import clean_chinese, number_to_words, spell_out_numbers
from cosyserve.frontend.text.split import is_only_punctuation
from cosyserve.frontend.tokenizer import TextTokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_dir / "model")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024年3月5日", "二零二四年三月五日"),
        ("今天是2024-03-05", "今天是二零二四年三月五日"),
        ("花了12.5元", "花了十二点五元"),
        ("价格¥100", "价格一百元"),
        ("温度-3.5度", "温度负三点五度"),
        ("增长了25%", "增长了百分之二十五"),
        ("比分3:2", "比分三比二"),
        ("1,234,567人", "一百二十三万四千五百六十七人"),
    ],
)
def test_chinese(text: str, expected: str) -> None:
    assert normalize_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("It costs $5.", "It costs five dollars."),
        ("I was born on March 5, 1990.", "I was born on the fifth of march, nineteen ninety."),
        ("Meet at 10:30 am", "Meet at ten thirty AM"),
        ("it weighs 3 kg", "it weighs three kilograms"),
        ("12.5% of 100 mph", "twelve point five percent of one hundred miles per hour"),
    ],
)
def test_english(text: str, expected: str) -> None:
    assert normalize_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Say [M][AY0] 5 times [breath] at 10:30 am.", "Say [M][AY0] five times [breath] at ten thirty AM."),
        ("It costs $5[laughter].", "It costs five dollars[laughter]."),
        ("<strong>3</strong>个苹果", "<strong>三</strong>个苹果"),
        ("2024年[breath]报道[j][ǐ]予好评", "二零二四年[breath]报道[j][ǐ]予好评"),
    ],
)
def test_special_tags_are_protected(text: str, expected: str) -> None:
    assert normalize_text(text) == expected


@pytest.mark.parametrize("text", ["", "   ", "[breath]", "。。。", "[j][ǐ]", "<strong></strong>", "?!"])
def test_tags_or_punctuation_only_do_not_crash(text: str) -> None:
    assert normalize_text(text) == text.strip()


def test_normalisers_are_shared_between_threads() -> None:
    texts = ["花了12.5元", "It costs $5.", "温度-3.5度", "Meet at 10:30 am"] * 4
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(normalize_text, texts))
    assert results == [normalize_text(text) for text in texts]


def test_nfc_first(tokenizer: TextTokenizer) -> None:
    decomposed = unicodedata.normalize("NFD", "报道[j][ǐ]予好评")
    assert decomposed != "报道[j][ǐ]予好评"
    normalized = normalize_text(decomposed)
    assert normalized == "报道[j][ǐ]予好评"
    assert tokenizer.token_to_id("[ǐ]") in tokenizer.encode(normalized)


def test_official_chinese_cleanups() -> None:
    assert clean_chinese("第一行\n第二行 hello world") == "第一行第二行hello world"
    assert clean_chinese("A - B和C") == "A，B和C"
    assert clean_chinese("（注意）这是【重点】——好的，") == "注意这是重点 好的。"
    assert clean_chinese("面积5m²，体积3m³") == "面积5m平方，体积3m立方"
    assert clean_chinese("结束.") == "结束。"


def test_language_choice_ignores_tags() -> None:
    assert text_language("你好") == "zh"
    assert text_language("[j][ǐ] hello") == "en"
    assert text_language("[j][ǐ]。") == "zh"
    assert text_language("[M][AY0].") == "en"
    assert text_language("レキシ テキ") == "en"


def test_spelled_numbers() -> None:
    assert number_to_words(0) == "zero"
    assert number_to_words(123) == "one hundred and twenty three"
    assert number_to_words(2_000_005) == "two million and five"
    assert spell_out_numbers("room 42, code 007") == "room forty two, code zero zero seven"


def _sentences(count: int) -> str:
    return "".join(f"第{i}句话说的是今天天气很好我们一起去公园散步。" for i in range(count))


def test_chinese_pieces_stay_within_bounds(tokenizer: TextTokenizer) -> None:
    text = normalize_text(_sentences(12))
    pieces = split_text(text, tokenizer, "zh")
    assert len(pieces) > 2
    assert "".join(pieces) == text
    for piece in pieces[:-1]:
        assert 60 < len(piece) <= 80
    assert len(pieces[-1]) >= 20


def test_english_pieces_counted_in_tokens(tokenizer: TextTokenizer) -> None:
    text = " ".join(f"Sentence {i} is about the weather, which is fine today." for i in range(10))
    pieces = split_text(normalize_text(text), tokenizer, "en")
    assert len(pieces) > 1
    sentence_tokens = max(len(tokenizer.encode(f" Sentence {i} is about the weather.")) for i in range(10))
    for piece in pieces[:-1]:
        assert 60 < len(tokenizer.encode(piece)) <= 60 + 2 * sentence_tokens
    assert all(piece[-1] == "." for piece in pieces)


def test_no_piece_is_only_punctuation(tokenizer: TextTokenizer) -> None:
    text = "……" + _sentences(4) + "！！？？。。。[breath]。" + _sentences(3) + "。。。"
    pieces = split_text(text, tokenizer, "zh")
    assert pieces and not any(is_only_punctuation(piece) for piece in pieces)
    assert "".join(pieces) == text


def test_tags_are_never_split(tokenizer: TextTokenizer) -> None:
    emphasis = "<strong>" + "这一句很长。" * 20 + "</strong>"
    text = _sentences(4) + emphasis + "报道[j][ǐ]予好评。" * 10 + "[breath]"
    pieces = split_text(text, tokenizer, "zh")
    assert len(pieces) > 1
    assert "".join(pieces) == text
    for piece in pieces:
        assert piece.count("<strong>") == piece.count("</strong>")
        assert "[j]" not in piece or piece.count("[j][ǐ]") == piece.count("[j]")
    assert not any(piece.startswith("[breath]") for piece in pieces)


def test_long_sentence_without_periods_is_cut_at_commas(tokenizer: TextTokenizer) -> None:
    text = "今天天气很好，我们一起去公园散步吧，" * 12
    pieces = split_text(text, tokenizer, "zh")
    assert len(pieces) > 1
    assert all(len(piece) <= 80 for piece in pieces)


def test_final_punctuation_added(tokenizer: TextTokenizer) -> None:
    assert split_text("你好", tokenizer, "zh") == ["你好。"]
    assert split_text("hello", tokenizer, "en") == ["hello."]
    assert split_text("你好。[breath]", tokenizer, "zh") == ["你好。[breath]"]
    assert split_text("。。。", tokenizer, "zh") == []


def test_short_text_warning() -> None:
    assert short_text_warning("好。", "希望你以后能够做的比我还好呦。") is not None
    assert short_text_warning("八百标兵奔北坡。", "希望你以后能够做的比我还好呦。") is None
    assert short_text_warning("好。", "") is None
