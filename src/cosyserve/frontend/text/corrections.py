"""Reading rules: patterns the official normaliser reads wrong, each with the reading cosyserve uses.

A rule runs on plain text (no special tags) before wetext and gives each match one of two readings:
- a rewrite: another written form that wetext then reads right (`¥12.50` -> `¥12.5`, `3–5` -> `3 to 5`);
  the text stays plain, so wetext still sees its context;
- spoken words (`$12.50` -> `twelve dollars and fifty cents`): final, never shown to wetext.
Rules run in order, each on the plain text the rules before it left, so a later rule sees earlier rewrites
and never touches spoken words. A rule matches only where the official reading is wrong: everywhere else
the text reaches wetext unchanged and reads exactly as the official.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Reading:
    """What a rule makes of one match."""

    text: str
    spoken: bool  # True: final words; False: a rewritten written form for wetext


@dataclass(frozen=True)
class Rule:
    """One correction: where it applies (`pattern`) and what is read instead (`read`; None: leave it)."""

    name: str  # shown to users, e.g. "money with cents"
    pattern: re.Pattern[str]
    read: Callable[[re.Match[str]], Reading | None]


@dataclass(frozen=True)
class Correction:
    """One place where cosyserve reads the text differently from the official normaliser."""

    rule: str
    written: str  # the text as typed (for punctuation: the run of marks)
    reading: str  # what is read instead, or (`rewritten`) the written form wetext was given instead
    rewritten: bool  # True: `reading` went on to wetext; False: `reading` is what the LM gets


@dataclass(frozen=True)
class Piece:
    """A stretch of text: plain (still to be normalised) or spoken words (final)."""

    text: str
    spoken: bool


def apply_rules(text: str, rules: Sequence[Rule]) -> tuple[list[Piece], list[Correction]]:
    """Run `rules` in order over plain `text`: the pieces, in order, and every correction made."""
    pieces = [Piece(text, spoken=False)]
    corrections: list[Correction] = []
    for rule in rules:
        next_pieces: list[Piece] = []
        for piece in pieces:
            if piece.spoken:
                next_pieces.append(piece)
            else:
                next_pieces.extend(_apply_rule(piece.text, rule, corrections))
        pieces = _merge_plain(next_pieces)
    return pieces, corrections


def _apply_rule(text: str, rule: Rule, corrections: list[Correction]) -> list[Piece]:
    pieces: list[Piece] = []
    plain: list[str] = []
    position = 0
    for match in rule.pattern.finditer(text):
        reading = rule.read(match)
        if reading is None or reading.text == match.group():
            continue
        plain.append(text[position : match.start()])
        if reading.spoken:
            pieces.append(Piece("".join(plain), spoken=False))
            pieces.append(Piece(reading.text, spoken=True))
            plain = []
        else:
            plain.append(reading.text)
        corrections.append(Correction(rule.name, match.group(), reading.text, not reading.spoken))
        position = match.end()
    plain.append(text[position:])
    pieces.append(Piece("".join(plain), spoken=False))
    return pieces


def _merge_plain(pieces: list[Piece]) -> list[Piece]:
    """Drop empty plain pieces and join neighbouring plain ones (wetext should see them together)."""
    merged: list[Piece] = []
    for piece in pieces:
        if not piece.spoken and not piece.text:
            continue
        if merged and not piece.spoken and not merged[-1].spoken:
            merged[-1] = Piece(merged[-1].text + piece.text, spoken=False)
        else:
            merged.append(piece)
    return merged


def rewrite(template: str) -> Callable[[re.Match[str]], Reading]:
    """A rule reading that rewrites the match with `match.expand(template)` (`\\1` etc.) for wetext."""
    return lambda match: Reading(match.expand(template), spoken=False)
