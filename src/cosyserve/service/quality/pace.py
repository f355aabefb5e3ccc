"""Duration sanity: voiced seconds per spoken unit against what the voice (or the language) does.

A unit is a syllable, estimated from the written text: a CJK character or a kana is one, a Latin word has
one per vowel group (at least one), a digit one. The voice's own rate comes from its prompt: its length
over the units of its transcript. Without a transcript, the language's typical rate is the reference.
"""

from __future__ import annotations

import re

from cosyserve.frontend.text.tags import strip_tags

# Typical voiced seconds per syllable (read speech, pauses excluded): Mandarin ~5 syll/s, English ~4.
TYPICAL_SECONDS_PER_UNIT = {"cjk": 0.2, "latin": 0.25}
MIN_UNITS = 4  # fewer and the model's own padding dominates: the pace is not judged
PROMPT_TOKEN_RATE = 25.0  # prompt speech tokens per second

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
_LATIN_WORD = re.compile(r"[A-Za-z\u00c0-\u024f']+")
_VOWEL_GROUP = re.compile(r"[aeiouyàâäéèêëîïôöùûüáíóúœæ]+", re.IGNORECASE)
_DIGIT = re.compile(r"\d")


def spoken_units(text: str) -> int:
    """Estimated syllables in `text` (tags and pronunciation tokens removed)."""
    plain = strip_tags(text)
    units = len(_CJK.findall(plain)) + len(_DIGIT.findall(plain))
    for word in _LATIN_WORD.findall(plain):
        units += max(1, len(_VOWEL_GROUP.findall(word)))
    return units


def script_of(text: str) -> str:
    """ "cjk" when most letters are CJK or kana, else "latin"."""
    plain = strip_tags(text)
    cjk = len(_CJK.findall(plain))
    latin = sum(len(w) for w in _LATIN_WORD.findall(plain))
    return "cjk" if cjk * 3 >= latin else "latin"  # one CJK character ~ one syllable ~ three letters


def voice_seconds_per_unit(prompt_tokens: int, transcript: str | None) -> float | None:
    """The voice's own pace from its prompt (speech tokens at 25 Hz, transcript), None when unknown."""
    if not transcript or prompt_tokens <= 0:
        return None
    units = spoken_units(transcript)
    if units < MIN_UNITS:
        return None
    return prompt_tokens / PROMPT_TOKEN_RATE / units


def pace(
    voiced_s: float, text: str, speed: float, voice_rate: float | None
) -> tuple[float | None, float | None]:
    """(seconds per unit, ratio to the expected) for `voiced_s` seconds of speech saying `text` at
    `speed`; (None, None) when the text is too short to judge. The prompt's pace includes its pauses,
    so the voice's rate is used as it is (slightly long): the ratio's range absorbs it."""
    units = spoken_units(text)
    if units < MIN_UNITS:
        return None, None
    per_unit = voiced_s / units
    expected = voice_rate if voice_rate is not None else TYPICAL_SECONDS_PER_UNIT[script_of(text)]
    return per_unit, per_unit * speed / expected
