"""Looping in the LM's speech tokens: the share of n-grams that repeat an earlier one.

Speech tokens come at 25 Hz from 6561 codes; natural speech rarely says the same 5 tokens (0.2 s) twice in
one segment except in silence, while a looping LM repeats whole stretches. Runs of one token (silence or a
stuck LM) are left to the silence and pace checks: an n-gram of a single repeated code is not counted.
"""

from __future__ import annotations

from collections.abc import Sequence

NGRAM = 5


def repetition_ratio(segments: Sequence[Sequence[int]], n: int = NGRAM) -> float:
    """Share in [0, 1] of the n-grams (within each segment) equal to an earlier n-gram of the same segment;
    n-grams made of one code only are skipped. 0.0 when there are none."""
    repeated = total = 0
    for tokens in segments:
        seen: set[tuple[int, ...]] = set()
        for start in range(len(tokens) - n + 1):
            gram = tuple(tokens[start : start + n])
            if len(set(gram)) == 1:
                continue
            total += 1
            if gram in seen:
                repeated += 1
            seen.add(gram)
    return repeated / total if total else 0.0
