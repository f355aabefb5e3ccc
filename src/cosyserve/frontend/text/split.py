"""Split a normalised text into the pieces that the LM synthesises one at a time.

Same policy as the official `split_paragraph`: cut after sentence punctuation, then merge sentences
greedily so that a piece is closed once it is longer than `token_min_n` and the next sentence would push it
past `token_max_n`; a short last piece (under `merge_len`) joins the one before. Lengths are characters for
Chinese (as the official does; a special tag counts as one) and tokenizer tokens otherwise.

Differences, on purpose: a special tag or a `[x][y]` token group is one unit and never cut; no cut falls
inside `<strong>…</strong>` or `<laughter>…</laughter>`; a run of punctuation stays together (`?!`, `……`)
instead of losing all but its first mark; a piece with nothing to say (only punctuation and tags) joins a
neighbour instead of becoming its own LM call; a sentence longer than `token_max_n` is cut at commas.

`split_long_text` cuts a text that is too long for one request (a long-text job) into requests, with the
same punctuation, by characters, before normalisation.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from typing import Protocol

from cosyserve.errors import TextError
from cosyserve.frontend.text.normalize import Language
from cosyserve.frontend.text.tags import PAIRED_TAGS, SPECIAL_TAG_PATTERN, split_protected, strip_control_tags

_ZH_ENDS = frozenset("。？！；：、.?!;…")
_OTHER_ENDS = frozenset(".?!;:。？！；：…")
_COMMAS = frozenset("，,、；;")
# A raw text (not yet normalised) also ends sentences at line breaks, in either language.
_RAW_ENDS = _ZH_ENDS | _OTHER_ENDS | frozenset("\n")
# Where a typed text may be cut into clauses (to find the typed words of each segment, `typed`).
CLAUSE_ENDS = _RAW_ENDS | _COMMAS
# Closing quotes and brackets stay with the sentence they close.
_CLOSERS = frozenset("\"'”’」』）)》")
_CLOSING_TAGS = frozenset(PAIRED_TAGS.values())

TOKEN_MAX_N = 80
TOKEN_MIN_N = 60
MERGE_LEN = 20
SHORT_TEXT_RATIO = 0.5


class Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


def is_only_punctuation(text: str) -> bool:
    """True for text made only of punctuation, symbols and blanks, invisible ones included (an empty
    text too)."""
    return all(unicodedata.category(char)[0] in "PSZ" or _is_invisible(char) for char in text)


def _is_invisible(char: str) -> bool:
    """Whitespace, a format character (Unicode category Cf: zero-width space, non-joiner and joiner,
    byte-order mark, word joiner, direction marks, soft hyphen, invisible operators) or a control
    character (Cc: NUL and the other C0/C1 codes)."""
    return char.isspace() or unicodedata.category(char) in ("Cf", "Cc")


# Invisible characters a text may keep: the line breaks and tabs normalisation reads as blanks, and the
# joiners that hold an emoji sequence or a Persian word together.
_KEPT_INVISIBLE = frozenset("\t\n\r\u200c\u200d")


def drop_invisible(text: str) -> str:
    """`text` without control characters (NUL, escape codes, C1 codes) and format characters (zero-width
    spaces, byte-order marks, direction marks and overrides, soft hyphens): the LM would get each as a
    token of its own, and read it as noise."""
    return "".join(
        char for char in text if char in _KEPT_INVISIBLE or unicodedata.category(char) not in ("Cc", "Cf")
    )


def require_visible_text(text: str) -> None:
    """InputError unless `text` shows something: the one emptiness check of every path that takes a text
    to speak (a request, a job, a batch item), so that a text of zero-width characters is empty too."""
    if not all(_is_invisible(char) for char in text):
        return
    if text.strip():
        raise TextError(
            "the text is empty: it holds only invisible characters (zero-width spaces or joiners, byte-order "
            "marks, direction marks, control characters): give the words to speak"
        )
    raise TextError("the text is empty: give the words to speak")


def has_content(piece: str) -> bool:
    """Does a piece give the LM something to say: a word, a digit or a special tag?"""
    return SPECIAL_TAG_PATTERN.search(piece) is not None or not is_only_punctuation(piece)


def _units(text: str) -> list[str]:
    """Characters, with each special tag as one unit."""
    units: list[str] = []
    for chunk, is_tag in split_protected(text):
        units.extend([chunk] if is_tag else list(chunk))
    return units


def cut_after(text: str, marks: frozenset[str]) -> list[str]:
    """Cut `text` after every run of `marks` (with the closing quotes that follow) outside paired tags."""
    units = _units(text)
    pieces: list[str] = []
    current: list[str] = []
    open_pairs = 0
    i = 0
    while i < len(units):
        unit = units[i]
        current.append(unit)
        i += 1
        if unit in PAIRED_TAGS:
            open_pairs += 1
        elif unit in _CLOSING_TAGS:
            open_pairs = max(0, open_pairs - 1)
        elif unit in marks and open_pairs == 0:
            while i < len(units) and (units[i] in marks or units[i] in _CLOSERS):
                current.append(units[i])
                i += 1
            pieces.append("".join(current))
            current = []
    if current:
        pieces.append("".join(current))
    return pieces


def _attach_empty(pieces: list[str]) -> list[str]:
    """Join every piece without content to the piece before it (the first such piece to the next one)."""
    out: list[str] = []
    carry = ""
    for piece in pieces:
        if not has_content(piece):
            if out:
                out[-1] += piece
            else:
                carry += piece
            continue
        out.append(carry + piece)
        carry = ""
    if carry and out:
        out[-1] += carry
    return out


def split_text(
    text: str,
    tokenizer: Encoder,
    lang: Language = "zh",
    *,
    token_max_n: int = TOKEN_MAX_N,
    token_min_n: int = TOKEN_MIN_N,
    merge_len: int = MERGE_LEN,
    comma_split: bool = False,
) -> list[str]:
    """Pieces of a normalised text, in order, each stripped; [] when the text has nothing to say."""
    text = text.strip()
    if not has_content(text):
        return []
    ends = _ZH_ENDS if lang == "zh" else _OTHER_ENDS
    if comma_split:
        ends = ends | _COMMAS
    plain = strip_control_tags(text).rstrip()
    if plain and plain[-1] not in ends and plain[-1] not in _CLOSERS:
        text += "。" if lang == "zh" else "."

    measure = _measure(tokenizer, lang)
    sentences: list[str] = []
    for sentence in _attach_empty(cut_after(text, ends)):
        if measure(sentence) > token_max_n:
            sentences.extend(_attach_empty(cut_after(sentence, _COMMAS)))
        else:
            sentences.append(sentence)

    pieces: list[str] = []
    current = ""
    for sentence in sentences:
        if current and measure(current + sentence) > token_max_n and measure(current) > token_min_n:
            pieces.append(current)
            current = ""
        current += sentence
    if current:
        if pieces and measure(current) < merge_len:
            pieces[-1] += current
        else:
            pieces.append(current)
    return [piece.strip() for piece in pieces if has_content(piece)]


def split_long_text(text: str, max_chars: int) -> list[str]:
    """Pieces of at most `max_chars` characters, cut after sentences (else commas, else anywhere) and
    merged greedily; punctuation that fits nowhere says nothing and is dropped."""
    if len(text.strip()) <= max_chars:
        return [text]
    units: list[str] = []
    for sentence in cut_after(text, _RAW_ENDS):
        if len(sentence) <= max_chars:
            units.append(sentence)
            continue
        for clause in cut_after(sentence, _COMMAS):
            units.extend(clause[i : i + max_chars] for i in range(0, len(clause), max_chars))
    pieces: list[str] = []
    for unit in units:
        if pieces and len(pieces[-1]) + len(unit) <= max_chars:
            pieces[-1] += unit
        elif has_content(unit):
            pieces.append(unit)
    return pieces


def _measure(tokenizer: Encoder, lang: Language) -> Callable[[str], int]:
    if lang == "zh":
        return lambda piece: len(SPECIAL_TAG_PATTERN.sub("\0", piece))
    return lambda piece: len(tokenizer.encode(piece))


def short_text_warning(segment: str, prompt_transcript: str) -> str | None:
    """A warning when `segment` is under half as long as the prompt transcript (the LM then often fails).

    Lengths are characters, as in the official check; None when the segment is long enough.
    """
    if not prompt_transcript or len(segment) >= SHORT_TEXT_RATIO * len(prompt_transcript):
        return None
    # (the transcript's length is not said: of a voice shared with the caller, it is its owner's)
    return (
        f"the text {segment!r} is less than half as long as the voice's transcript: speech for a text much "
        "shorter than its prompt often comes out wrong; use a longer text or a shorter prompt"
    )
