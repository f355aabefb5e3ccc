"""What the user typed for each spoken segment: the words subtitles and sentence timings show.

The LM reads the normalised text (`第二课`, `十二点五元`), split into segments after normalisation, and
each segment's audio is timed. A subtitle must show the text as typed (`第2课`, `¥12.50`) at those times,
so the typed text is cut into the same pieces: it is cut into clauses (after sentence marks and commas),
each clause is read on its own (`read`: the same conversions and normalisation as the whole text) and
kept as its own piece only where its reading is exactly the next stretch of the whole reading; otherwise
it joins the clause after it (a reading that needs its neighbours, `Room No. 5`). Readings are compared
without blanks and punctuation, which the normalisation moves (`，` at the end becomes `。`, runs collapse).

A typed piece and a segment rarely end at different places (a segment cut inside what can only be read
as one piece): the segments from the one where they part to the one where they meet again share one cue,
so the typed text goes to the first of them and the others get "" (`service.subtitles` extends the cue
over them). Text that no clause reading matches goes whole to the cue that ends the text: never lost,
never moved. A text spoken as one segment is that segment's typed text, without reading it again.
"""

from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Callable, Sequence

from cosyserve.errors import InputError
from cosyserve.frontend.text.split import CLAUSE_ENDS, cut_after

# A clause that a reading does not match joins the next; past this many, the rest is one piece (a text
# that reads nothing clause by clause would otherwise be read again once per clause, growing each time).
MAX_JOINED = 12
# A mark followed directly by a letter or digit is inside a word or number: 3.14, 1,234, 10:30, a.com.
_INNER_MARKS = frozenset(".,:")


def _key(text: str) -> str:
    """A reading without blanks and punctuation: what two readings of the same words share."""
    return "".join(c for c in text if not c.isspace() and not unicodedata.category(c).startswith("P"))


def clauses(typed: str) -> list[str]:
    """`typed` cut after sentence marks, commas and line breaks, never inside a number or an address."""
    pieces = cut_after(typed, CLAUSE_ENDS)
    joined: list[str] = []
    for piece in pieces:
        if joined and joined[-1][-1] in _INNER_MARKS and piece[:1].isalnum():
            joined[-1] += piece
        else:
            joined.append(piece)
    return joined


def _read_key(read: Callable[[str], str], text: str) -> str | None:
    try:
        return _key(read(text))
    except InputError:  # a clause cut out of a pronunciation or a tag: read it with its neighbours
        return None


def _typed_pieces(typed: str, whole: str, read: Callable[[str], str]) -> list[tuple[str, int]]:
    """The typed text as pieces, each with the length (in `_key` characters) of its part of `whole`."""
    pieces: list[tuple[str, int]] = []
    position, pending, joined = 0, "", 0
    for clause in clauses(typed):
        pending += clause
        joined += 1
        if joined > MAX_JOINED:
            continue
        reading = _read_key(read, pending)
        if reading is None:
            continue
        if not reading:  # says nothing (marks, blanks): it belongs with the piece before it
            if pieces:
                pieces[-1] = (pieces[-1][0] + pending, pieces[-1][1])
                pending, joined = "", 0
            continue
        if whole.startswith(reading, position):
            pieces.append((pending, len(reading)))
            position += len(reading)
            pending, joined = "", 0
    rest = len(whole) - position
    if pending or rest:
        if pieces and not (pending and rest):
            pieces[-1] = (pieces[-1][0] + pending, pieces[-1][1] + rest)
        else:
            pieces.append((pending, rest))
    return pieces


def typed_segments(
    typed: str,
    segments: Sequence[str],
    *,
    read: Callable[[str], str],
    show: Callable[[str], str],
) -> list[str]:
    """For each of `segments` (the spoken text, split), the typed text it speaks, shown with `show`.

    `read` reads a stretch of `typed` as the whole text was read (conversions and normalisation, in the
    whole text's language). Where one typed piece spans several segments, the first gets its text and the
    rest "" (see the module doc). A cue whose typed text shows as nothing keeps its spoken segment.
    """
    if not segments:
        return []
    if len(segments) == 1:  # the whole text is the one segment: nothing to read again
        return [show(typed) or segments[0]]
    keys = [_key(segment) for segment in segments]
    whole = "".join(keys)
    pieces = _typed_pieces(typed, whole, read)
    piece_ends = list(itertools.accumulate(length for _, length in pieces))
    ends = set(piece_ends)
    shown = [""] * len(segments)
    first, taken, end = 0, 0, 0
    for index, key in enumerate(keys):
        end += len(key)
        last = index == len(segments) - 1
        if not (last or end in ends):
            continue
        upto = len(pieces) if last else piece_ends.index(end) + 1
        text = show("".join(piece for piece, _ in pieces[taken:upto]))
        shown[first] = text or " ".join(segments[first : index + 1])
        first, taken = index + 1, upto
    return shown
