"""Pronunciation forms to native tokens, the lexicon, and Japanese to katakana."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest

from cosyserve.errors import InputError
from cosyserve.frontend.text import Lexicon, convert_pronunciations, spec_to_tokens, to_katakana
from cosyserve.frontend.text.pronunciation import PINYIN_FINALS, PINYIN_INITIALS, pinyin_to_tokens
from cosyserve.frontend.text.tags import PRONUNCIATION_TOKENS
from cosyserve.frontend.tokenizer import TextTokenizer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[重庆][chóng qìng]", "[ch][óng][q][ìng]"),
        ("[重庆](chóng qìng)", "[ch][óng][q][ìng]"),
        ("[重庆]（chong2 qing4）", "[ch][óng][q][ìng]"),
        ("[重庆][zhong4 qing4]", "[zh][òng][q][ìng]"),
        ("[重庆] [Chóng Qìng]", "[ch][óng][q][ìng]"),
        ("[minute][M AY0 N UW1 T]", "[M][AY0][N][UW1][T]"),
        ("I need a [minute](M AY0 N UW1 T).", "I need a [M][AY0][N][UW1][T]."),
        ("对报道[j][ǐ]予好评", "对报道[j][ǐ]予好评"),
        ("[h][ào]人[M][AY0][N][UW1][T]", "[h][ào]人[M][AY0][N][UW1][T]"),
        ("[breath]你好<strong>真的</strong>", "[breath]你好<strong>真的</strong>"),
        ("[sad] I lost it [注][1]", "[sad] I lost it [注][1]"),
    ],
)
def test_word_forms_become_native_tokens(text: str, expected: str) -> None:
    assert convert_pronunciations(text) == expected


@pytest.mark.parametrize(
    ("syllable", "tokens"),
    [
        ("hao4", ["[h]", "[ào]"]),
        ("ji3", ["[j]", "[ǐ]"]),
        ("ai4", ["[ài]"]),  # no initial
        ("er2", ["[ér]"]),
        ("ou3", ["[ǒu]"]),
        ("yue4", ["[y]", "[uè]"]),  # y and w are initials in the model's spelling
        ("yu2", ["[y]", "[ú]"]),
        ("yi1", ["[y]", "[ī]"]),
        ("wo3", ["[w]", "[ǒ]"]),
        ("qu4", ["[q]", "[ù]"]),  # j q x + ü is written u
        ("lv4", ["[l]", "[ǜ]"]),
        ("nü3", ["[n]", "[ǚ]"]),
        ("lu:e4", ["[l]", "[vè]"]),
        ("lüè", ["[l]", "[vè]"]),
        ("de5", ["[d]", "[e]"]),  # neutral tone: the bare final
        ("de", ["[d]", "[e]"]),
        ("de0", ["[d]", "[e]"]),
        ("liu4", ["[l]", "[iù]"]),
        ("gui4", ["[g]", "[uì]"]),
        ("xiao3", ["[x]", "[iǎo]"]),
        ("zhi1", ["[zh]", "[ī]"]),
        ("ZHÒNG", ["[zh]", "[òng]"]),
    ],
)
def test_pinyin_syllables(syllable: str, tokens: list[str]) -> None:
    assert pinyin_to_tokens(syllable) == tokens


def _numbered(final: str) -> str:
    """`ào` -> `ao4`: the tone-number spelling of a toned final."""
    decomposed = unicodedata.normalize("NFD", final)
    marks = {"\u0304": "1", "\u0301": "2", "\u030c": "3", "\u0300": "4"}
    tone = next((marks[char] for char in decomposed if char in marks), "5")
    plain = unicodedata.normalize("NFC", "".join(char for char in decomposed if char not in marks))
    return plain.replace("ü", "v") + tone


@pytest.mark.parametrize("initial", ["", "l"])
def test_every_final_is_reachable_from_marks_and_numbers(initial: str) -> None:
    for final in sorted(PINYIN_FINALS):
        expected = ([f"[{initial}]"] if initial else []) + [f"[{final}]"]
        assert pinyin_to_tokens(initial + final) == expected, final
        assert pinyin_to_tokens(initial + _numbered(final)) == expected, final


def test_token_sets_come_from_the_special_tokens() -> None:
    assert all(f"[{initial}]" in PRONUNCIATION_TOKENS for initial in PINYIN_INITIALS)
    assert {"ào", "ǐ", "vè", "ǜ", "iǎo", "uāng", "e", "ér"} <= PINYIN_FINALS


def test_converted_tokens_are_single_ids(tiny_dir: Path) -> None:
    tokenizer = TextTokenizer.from_dir(tiny_dir / "model")
    text = convert_pronunciations("[重庆][zhong4 qing4][绿][lv4][minute][M AY0 N UW1 T]")
    tokens = ["[" + token for token in text.split("[")[1:]]
    assert tokenizer.encode(text) == [tokenizer.token_to_id(token) for token in tokens]
    assert None not in [tokenizer.token_to_id(token) for token in tokens]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[zhong4]", "[zhong4]"),
        ("[hǎo]", "[h][ǎo]"),  # the message suggests the native spelling
        ("[zh][ong9]", "[ong9]"),
        ("[AY3]", "[AY3]"),
        ("[重庆][chong2 qinx4]", "qinx4"),
        ("[重][jia5]", "jia5"),  # no neutral-tone token for the final ia
        ("[minute][M AY9 N]", "AY9"),
        ("[重庆][chong2]", "2 characters but 1 pinyin syllables"),
        ("[重庆][M AY0]", "CMU"),
        # A spelling with no word before it was read out letter by letter, its tone digits as numbers.
        (
            "我去[chong2 qing4]玩。",
            "write the word first, e.g. [重庆][chong2 qing4] (or as tokens: [ch][óng][q][ìng])",
        ),
        ("[chóng qìng]", "[重庆][chóng qìng]"),
        ("the [M AY0 N UW1 T]", "[minute][M AY0 N UW1 T]"),
        # an unclosed or empty spelling after a word was read out, brackets, letters and tone digits
        ("[重庆][chóng qìng", "close it, e.g. [重庆][chóng qìng]"),
        ("结尾[重庆](chong2", "close it, e.g. [重庆](chong2)"),
        ("[重庆][chóng qìng，然后\n下一行", "is not closed"),
        ("[minute][M AY0 N", "[minute][M AY0 N]"),
        ("[重庆][]", "empty pronunciation"),
        ("[重庆]（ ）", "empty pronunciation"),
    ],
)
def test_unknown_phones_are_input_errors(text: str, named: str) -> None:
    with pytest.raises(InputError) as error:
        convert_pronunciations(text)
    assert named in str(error.value)


def test_bracketed_words_that_are_not_spellings_stay_words() -> None:
    for text in (
        "[hello world]",
        "[breath]你好",
        "[AY1]",
        "[New York]",
        "[de le]",
        "参考[1](see page",
        "[注](见下文",
    ):
        assert convert_pronunciations(text) == text


def test_spec_forms() -> None:
    assert spec_to_tokens("[chóng qìng]") == ["[ch]", "[óng]", "[q]", "[ìng]"]
    assert spec_to_tokens("chong2, qing4") == ["[ch]", "[óng]", "[q]", "[ìng]"]
    assert spec_to_tokens("[zh][òng]") == ["[zh]", "[òng]"]
    assert spec_to_tokens("M AY0") == ["[M]", "[AY0]"]
    with pytest.raises(InputError):
        spec_to_tokens("[zh][ong7]")


def test_lexicon() -> None:
    lexicon = Lexicon(
        {
            "重庆": "chóng qìng",
            "重庆市": "[chong2 qing4 shi4]",
            "行长": "hang2 zhang3",
            "minute": "M AY0 N UW1 T",
        }
    )
    assert lexicon.entries["重庆"] == "[ch][óng][q][ìng]"
    assert lexicon.apply("重庆市的行长") == "[ch][óng][q][ìng][sh][ì]的[h][áng][zh][ǎng]"
    assert lexicon.apply("Wait a Minute, minutes later") == "Wait a [M][AY0][N][UW1][T], minutes later"
    # Markup already in the text is left alone.
    assert lexicon.apply("[重庆](zhong4 qing4)和重庆") == "[重庆](zhong4 qing4)和[ch][óng][q][ìng]"
    assert lexicon.apply("<strong>行长</strong>") == "<strong>[h][áng][zh][ǎng]</strong>"
    assert len(lexicon) == 4
    assert Lexicon({}).apply("重庆") == "重庆"


@pytest.mark.parametrize(
    ("entries", "named"),
    [
        ({"重庆": "chong2 qinx4"}, "重庆"),
        ({"重庆": "chong2"}, "重庆"),
        ({"": "a1"}, "empty"),
        ({"[x]": "a1"}, "brackets"),
        ({"word": ""}, "no pronunciation"),
        ({"word": "M AY9"}, "AY9"),
    ],
)
def test_lexicon_rejects_bad_entries(entries: dict[str, str], named: str) -> None:
    with pytest.raises(InputError, match=named):
        Lexicon(entries)


def test_japanese_to_katakana() -> None:
    converted = to_katakana("私は学生です。")
    assert converted == "ワタシ ワ ガクセイ デス。"
    converted = to_katakana("歴史的世界においては、過去は単に過ぎ去ったものではない。")
    assert not any("\u4e00" <= char <= "\u9fff" or "\u3041" <= char <= "\u3096" for char in converted)
    assert converted.startswith("レキシテキ セカイ")


def test_japanese_today_is_read_as_a_greeting_only_when_it_stands_alone() -> None:
    """pykakasi reads every 今日は as こんにちは, so the Studio's own example said "konnichiwa" twice."""
    assert to_katakana("こんにちは、今日はいい天気ですね。") == "コンニチワ、キョウ ワ イイ テンキ デスネ。"
    assert to_katakana("今日は、雨です。") == "キョウ ワ、アメ デス。"
    assert to_katakana("今日は！") == "コンニチワ！"
    assert to_katakana("今日は。元気ですか？") == "コンニチワ。ゲンキ デスカ？"


def test_japanese_only_where_there_is_kana() -> None:
    assert to_katakana("今日は良い天気です。我今天很高兴。") == "キョウ ワ ヨイ テンキ デス。我今天很高兴。"
    written = "レキシ テキ セカイ ニ オイ テ ワ、カコ ワ タンニ。"
    assert to_katakana(written) == written
    assert to_katakana("오늘 정말 반갑습니다.") == "오늘 정말 반갑습니다."
    assert to_katakana("[breath]私は学生です[laughter]。") == "[breath]ワタシ ワ ガクセイ デス[laughter]。"
    assert to_katakana("东京タワー") != "东京タワー"  # kana present: the sentence is Japanese
