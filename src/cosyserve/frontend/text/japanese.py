"""Japanese for the LM: the model reads Japanese only as katakana, so kanji and hiragana are converted.

Which sentences are Japanese? Those that hold a hiragana or katakana character: Chinese never does, so a
Chinese sentence keeps its Han characters even in a text that mixes both languages. In a Japanese
sentence everything is rewritten in katakana with pykakasi, word units separated by blanks the way the
official example writes it (`レキシ テキ セカイ ニ ...`), and the particles は/へ/を read as ワ/エ/オ.
今日は is the greeting (コンニチワ) only as a sentence of its own; within one it is キョウ ワ ("today").
A sentence already written only in katakana is left exactly as typed. Korean and other scripts pass
through. Numbers are not read in Japanese: the normaliser later spells them out in English.
"""

from __future__ import annotations

import re
import threading

from cosyserve.frontend.text.tags import map_plain, strip_tags

# Hiragana, katakana (without ・ and ー, which Chinese text uses too) and half-width katakana.
_KANA = re.compile(r"[\u3041-\u3096\u30a1-\u30fa\uff66-\uff9d]")
_NEEDS_CONVERSION = re.compile(r"[\u3041-\u3096\u3400-\u4dbf\u4e00-\u9fff\uff66-\uff9d]")
_SENTENCE = re.compile(r"[^。！？!?\n]*[。！？!?\n]*")
_PARTICLES = {"は": "ワ", "へ": "エ", "を": "オ"}
_FULLWIDTH_DIGITS = str.maketrans("０１２３４５６７８９", "0123456789")

_LOCK = threading.Lock()
_KAKASI = None


def contains_kana(text: str) -> bool:
    return _KANA.search(text) is not None


def to_katakana(text: str) -> str:
    """Convert the Japanese sentences of `text` to katakana; other sentences and special tags are kept."""
    sentences = [s for s in _SENTENCE.findall(text) if s]
    return "".join(_convert_sentence(s) if _is_japanese(s) else s for s in sentences)


def _is_japanese(sentence: str) -> bool:
    plain = strip_tags(sentence)
    return contains_kana(plain) and _NEEDS_CONVERSION.search(plain) is not None


def _convert_sentence(sentence: str) -> str:
    return map_plain(sentence, _katakana_words)


def _katakana_words(chunk: str) -> str:
    if not chunk.strip():
        return chunk
    global _KAKASI
    with _LOCK:  # pykakasi does not promise thread safety; conversions are short
        if _KAKASI is None:
            import pykakasi

            _KAKASI = pykakasi.kakasi()
        units = _KAKASI.convert(chunk.translate(_FULLWIDTH_DIGITS))
    alone = sum(1 for unit in units if any(_is_word(char) for char in unit["orig"])) == 1
    words: list[str] = []
    for unit in units:
        original, kana = unit["orig"], unit["kana"]
        if original == "今日は" and not alone:
            kana = "キョウ ワ"  # pykakasi always reads the greeting; in a sentence it is "today" + は
        elif original in _PARTICLES:
            kana = _PARTICLES[original]
        elif original.endswith("は") and kana.endswith("ハ"):
            kana = kana[:-1] + "ワ"  # では, には, 彼は: the topic particle
        words.append(kana)
    out = ""
    for word in words:
        if out and _is_word(out[-1]) and word and _is_word(word[0]):
            out += " "
        out += word
    return out


def _is_word(char: str) -> bool:
    """Does `char` belong to a word (kana, letter, digit), so that a blank goes between two units?"""
    return char.isalnum() or char == "ー"
