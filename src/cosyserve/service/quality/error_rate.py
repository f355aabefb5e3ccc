"""Word or character error rate of a transcript against the text, by edit-distance alignment.

Both sides are normalised (lower case, punctuation and tags removed). Text with CJK characters is compared
character by character (CER), other text word by word (WER). The rate is (substitutions + deletions +
insertions) / reference length, so it can exceed 1 for a long wrong transcript.
"""

from __future__ import annotations

import re
import unicodedata

from cosyserve.frontend.text.tags import strip_tags
from cosyserve.service.quality.pace import script_of

_PUNCTUATION = re.compile(r"[^\w\s']|_", re.UNICODE)


def normalise_words(text: str, by_character: bool) -> list[str]:
    """`text` -> the units compared: words, or characters (spaces dropped) when `by_character`."""
    plain = unicodedata.normalize("NFKC", strip_tags(text)).lower()
    plain = _PUNCTUATION.sub(" ", plain)
    if by_character:
        return [ch for ch in plain if not ch.isspace()]
    return plain.split()


def edit_distance(reference: list[str], hypothesis: list[str]) -> int:
    """Levenshtein distance between two sequences (substitution, deletion, insertion each cost 1)."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, start=1):
        current = [i] + [0] * len(hypothesis)
        for j, hyp in enumerate(hypothesis, start=1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref != hyp))
        previous = current
    return previous[-1]


def error_rate(reference: str, hypothesis: str) -> float:
    """WER (or CER for CJK text) of `hypothesis` against `reference`; 0.0 for two empty texts."""
    by_character = script_of(reference) == "cjk"
    ref = normalise_words(reference, by_character)
    hyp = normalise_words(hypothesis, by_character)
    if not ref:
        return 0.0 if not hyp else 1.0
    return edit_distance(ref, hyp) / len(ref)
