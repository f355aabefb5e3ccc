"""Text normalisation: numbers, dates, money, units and addresses written out as words.

The official normalisation (`official`: wetext + the official cleanups) reads most text right; cosyserve
keeps its reading there, word for word, and corrects it where it is wrong (`readings_en`, `readings_zh`,
`web_readings`: rules that fire only on what the official misreads), then collapses runs of sentence marks
as the official sentence split does (`punctuation`). `normalize_report` also says what was corrected and
what the official would have read.

Special tags and pronunciation tokens are never shown to wetext or the rules: each stretch of text between
them is normalised on its own and the tags are put back unchanged (see `tags.split_protected`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cosyserve.frontend.text import readings_en, readings_zh
from cosyserve.frontend.text.corrections import Correction, Rule, apply_rules
from cosyserve.frontend.text.official import (
    Language,
    clean_chinese,
    drop_blanks,
    number_to_words,
    official_chunk,
    spell_out_numbers,
)
from cosyserve.frontend.text.punctuation import collapse_runs
from cosyserve.frontend.text.tags import PINYIN_TOKENS, nfc, split_protected, strip_tags

__all__ = [
    "Language",
    "Normalized",
    "clean_chinese",
    "contains_chinese",
    "drop_blanks",
    "normalize_report",
    "normalize_text",
    "number_to_words",
    "official_normalize",
    "spell_out_numbers",
    "text_language",
]

_HAN = re.compile(r"[\u4e00-\u9fff]")
RULES: dict[str, tuple[Rule, ...]] = {"zh": readings_zh.RULES, "en": readings_en.RULES}
PUNCTUATION_RULE = "runs of punctuation"


def contains_chinese(text: str) -> bool:
    """Does `text` hold a CJK ideograph (the official test for choosing the Chinese path)?"""
    return _HAN.search(text) is not None


def text_language(text: str) -> Language:
    """`"zh"` when the text outside special tags holds Chinese characters, or pinyin tokens and no Latin
    letters (`[h][ǎo]。`); else `"en"`."""
    plain = strip_tags(text)
    if contains_chinese(plain):
        return "zh"
    has_pinyin = any(token in PINYIN_TOKENS for token, is_tag in split_protected(text) if is_tag)
    return "zh" if has_pinyin and not re.search(r"[A-Za-z]", plain) else "en"


@dataclass(frozen=True)
class Normalized:
    """A text as cosyserve reads it, and where and how that differs from the official reading."""

    spoken: str  # what the LM reads (before the sentence split)
    language: Language
    corrections: tuple[Correction, ...]  # in order of application; empty: read as the official reads it
    official: str | None = None  # what the official normalisation gives, when asked for


def normalize_report(text: str, lang: Language | None = None, *, with_official: bool = False) -> Normalized:
    """Normalise `text` (NFC, stripped) for the LM and report the corrections; special tags stay as they are.

    `lang` defaults to `text_language(text)`. With `with_official`, `official` holds the official reading of
    the same text (wetext runs twice). Empty, tag-only or punctuation-only text comes back without error.
    """
    text = nfc(text).strip()
    lang = lang or text_language(text)
    if not text:
        return Normalized("", lang, (), "" if with_official else None)
    spoken_parts: list[str] = []
    official_parts: list[str] = []
    corrections: list[Correction] = []
    for chunk, is_tag in split_protected(text):
        if is_tag:
            spoken_parts.append(chunk)
            official_parts.append(chunk)
            continue
        pieces, found = apply_rules(chunk, RULES[lang])
        corrections.extend(found)
        spoken_parts.extend(p.text if p.spoken else official_chunk(p.text, lang) for p in pieces)
        if with_official:
            official_parts.append(official_chunk(chunk, lang))
    spoken = "".join(spoken_parts)
    official = "".join(official_parts) if with_official else None
    if lang == "zh":
        spoken = clean_chinese(spoken)
        official = clean_chinese(official) if official is not None else None
    # On the whole text: no special tag holds a sentence mark, and a tag before a run counts as words
    # (the official split keeps the first mark after `[laughter]`).
    spoken, runs = collapse_runs(spoken, lang)
    corrections.extend(Correction(PUNCTUATION_RULE, run, run[0], rewritten=False) for run in runs)
    return Normalized(spoken, lang, tuple(corrections), official)


def normalize_text(text: str, lang: Language | None = None) -> str:
    """Normalise `text` for the LM; special tags stay as they are. `lang` defaults to `text_language(text)`.

    Text that is empty, only tags or only punctuation comes back (stripped) without error.
    """
    return normalize_report(text, lang).spoken


def official_normalize(text: str, lang: Language | None = None) -> str:
    """What the official normalisation reads for `text` (no corrections, no punctuation collapsing)."""
    reading = normalize_report(text, lang, with_official=True).official
    return reading or ""
