"""The official text normalisation, reproduced: wetext, then the official cleanups and number spell-out.

Chinese text goes through wetext's Chinese grammar, then the official cleanups: newlines dropped, blanks
removed except between two ASCII characters, ²/³ spelled out, every `.` made `。`, ` - ` made `，`, brackets
（）【】 and backticks dropped, `——` made a blank, trailing commas made `。`. Other text goes through
wetext's English grammar, then any digits left are spelled out in English.

`normalize` builds on this: it corrects the readings that are wrong before and around these calls, and
this module stays the reference for "what the official code reads" (tests mark each case against it).
"""

from __future__ import annotations

import re
import threading
from typing import Literal

Language = Literal["zh", "en"]

_LOCK = threading.Lock()
_NORMALIZERS: dict[str, object] = {}


def _normalizer(lang: Language):
    """One wetext Normalizer per language and process, built on first use (loading the FSTs takes time)."""
    with _LOCK:
        normalizer = _NORMALIZERS.get(lang)
        if normalizer is None:
            from wetext import Normalizer

            options = {"remove_erhua": False} if lang == "zh" else {}
            normalizer = Normalizer(lang=lang, operator="tn", **options)
            _NORMALIZERS[lang] = normalizer
        return normalizer


def wetext(chunk: str, lang: Language) -> str:
    """wetext on one stretch of plain text, keeping the blanks around it (wetext strips them)."""
    core = chunk.strip()
    if not core:
        return chunk
    try:
        normalized = _normalizer(lang).normalize(core)
    except (AssertionError, IndexError, KeyError, RuntimeError, ValueError):
        # wetext has no path for a few inputs; reading them unnormalised beats failing the request.
        normalized = core
    lead = chunk[: len(chunk) - len(chunk.lstrip())]
    trail = chunk[len(chunk.rstrip()) :]
    return lead + normalized + trail


def official_chunk(chunk: str, lang: Language) -> str:
    """One stretch of plain text (no special tags) as the official reads it, before the Chinese cleanups."""
    return wetext(chunk, "zh") if lang == "zh" else spell_out_numbers(wetext(chunk, "en"))


def clean_chinese(text: str) -> str:
    """The official cleanups for Chinese text after wetext (see the module doc)."""
    text = text.replace("\r", "").replace("\n", "").replace("\t", " ")
    text = drop_blanks(text)
    text = text.replace("²", "平方").replace("³", "立方")
    text = text.replace(".", "。")
    text = text.replace(" - ", "，")
    for mark in ("（", "）", "【", "】", "`"):
        text = text.replace(mark, "")
    text = text.replace("——", " ")
    return re.sub(r"[，,、]+$", "。", text)


def drop_blanks(text: str) -> str:
    """Remove spaces, except a single one between two ASCII non-space characters (`a b`, `3 kg`)."""
    kept = []
    for i, char in enumerate(text):
        if char == " ":
            before = text[i - 1] if i > 0 else " "
            after = text[i + 1] if i + 1 < len(text) else " "
            if not (before.isascii() and before != " " and after.isascii() and after != " "):
                continue
        kept.append(char)
    return "".join(kept)


_ONES = (
    *("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"),
    *("eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"),
)
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))


def number_to_words(number: int) -> str:
    """English words for a non-negative integer below 10**15: 123 -> "one hundred and twenty three"."""
    if number < 20:
        return _ONES[number]
    if number < 100:
        tens, ones = divmod(number, 10)
        return _TENS[tens] + (f" {_ONES[ones]}" if ones else "")
    if number < 1000:
        hundreds, rest = divmod(number, 100)
        return f"{_ONES[hundreds]} hundred" + (f" and {number_to_words(rest)}" if rest else "")
    for scale, name in _SCALES:
        if number >= scale:
            high, rest = divmod(number, scale)
            words = f"{number_to_words(high)} {name}"
            if rest:
                words += (" and " if rest < 100 else " ") + number_to_words(rest)
            return words
    raise ValueError(f"{number} is too large to spell out")


def spell_out_numbers(text: str) -> str:
    """Spell out the digit runs that wetext left; leading zeros and very long runs are read digit by digit."""

    def spell(match: re.Match[str]) -> str:
        digits = match.group()
        if (len(digits) > 1 and digits[0] == "0") or len(digits) > 15:
            return " ".join(_ONES[int(d)] for d in digits)
        return number_to_words(int(digits))

    return re.sub(r"[0-9]+", spell, text)
