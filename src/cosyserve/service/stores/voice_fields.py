"""What a voice's own fields may hold (its name, transcript and lexicon, checked before they are stored), and
which voice a name means when several owners use it."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import unicodedata
from typing import Any

import sqlalchemy as sa

from cosyserve.errors import InputError, LexiconError, VoiceNameInvalid, VoiceNameTaken
from cosyserve.frontend.text.lexicon import Lexicon
from cosyserve.service.requests import VoiceDefaults, VoiceScope

log = logging.getLogger(__name__)

# Letters and digits of any script (\w: Chinese, kana, Hangul, accents), spaces, '-', '.', and the
# katakana middle dot of foreign names (ジョン・スミス); no punctuation or symbols (【】 was a name).
NAME_PATTERN = re.compile(r"^[\w\-. \u30fb]{1,64}$")
# The vowel signs and viramas of Indic and other scripts are combining marks, not \w: प्रिया is a name
MARKS = ("Mn", "Mc")
JOINERS = ("\u200c", "\u200d")  # zero-width non-joiner and joiner
INVISIBLE_MARKS = frozenset(
    ["\u034f", *map(chr, range(0xFE00, 0xFE10)), *map(chr, range(0xE0100, 0xE01F0))]
)  # the grapheme joiner and the variation selectors: marks that show nothing
MAX_TRANSCRIPT_CHARS = 500
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # NUL (PostgreSQL refuses it), lone surrogates (not UTF-8)


def same_spelling(name: str) -> str:
    """`name` in NFC: "ü" typed as u + a combining diaeresis (NFD, as some keyboards and macOS file
    names give it) is the same name as the one-character "ü"."""
    return unicodedata.normalize("NFC", name) if isinstance(name, str) else name


def check_name(name: str) -> str:
    name = same_spelling((name or "").strip())
    if not NAME_PATTERN.fullmatch(_marks_as_letters(name)):
        raise VoiceNameInvalid(
            "a voice name must be 1-64 letters (of any script, Chinese characters too), digits, spaces, "
            "'-', '_', '.' or '・'"
        )
    if not re.search(r"[^\W_]", name):  # ".", "..": path-like names a file browser or a URL would misread
        raise VoiceNameInvalid(
            f"a voice name needs a letter, digit or character, not only dots, dashes or blanks: {name!r}"
        )
    return name


def _marks_as_letters(name: str) -> str:
    """`name` with the combining marks that spell a word written as letters: up to three after a letter of
    a script other than Latin (a vowel sign, a virama; Latin accents come composed, in NFC), never the
    invisible ones (a grapheme joiner, a variation selector: al\u034fice looked like alice). And a
    zero-width joiner or non-joiner between two such letters (Sinhala ශ්‍රී, Persian می‌خواهم spell words
    with them; between Latin letters they only hide a difference)."""
    said: list[str] = []
    base, marks = "", 0  # the letter the marks sit on, and how many it has
    for index, char in enumerate(name):
        following = name[index + 1 : index + 2]
        if char.isalnum():
            base, marks, letter = char, 0, True
        elif unicodedata.category(char) in MARKS and char not in INVISIBLE_MARKS:
            marks += 1
            letter = bool(base) and not base.isascii() and marks <= 3
        else:
            letter = (
                char in JOINERS
                and bool(base)
                and not base.isascii()
                and following.isalpha()
                and not following.isascii()
            )
            base, marks = ("", 0) if not letter else (base, marks)
        said.append("a" if letter else char)
    return "".join(said)


def check_transcript(transcript: str | None) -> str | None:
    if transcript is None or not transcript.strip():
        return None
    transcript = transcript.strip()
    if UNSTORABLE.search(transcript):
        raise InputError("the transcript contains a NUL character or a lone surrogate; remove it")
    if len(transcript) > MAX_TRANSCRIPT_CHARS:
        raise InputError(f"the transcript is {len(transcript)} characters; at most {MAX_TRANSCRIPT_CHARS}")
    return transcript


def lexicon_json(lexicon: dict[str, str]) -> str:
    """The lexicon as stored, once every entry compiles (InputError naming the first that does not): a
    voice saved with a bad entry would refuse every synthesis, its shared users' included."""
    text = json.dumps(lexicon, ensure_ascii=False)  # NUL comes out escaped; lone surrogates would not
    if UNSTORABLE.search(text):
        raise LexiconError("a lexicon entry contains a lone surrogate (not valid Unicode text); remove it")
    Lexicon(lexicon)
    return text


class AmbiguousVoice(InputError):
    """Several voices the caller may use have the name asked for, none of them the caller's own."""


def shared_of(row: Any) -> bool:
    """Rows from before the shared flag: a voice without an owner was shared."""
    return bool(row["shared"]) if row["shared"] is not None else row["owner"] is None


def pick_row(id_or_name: str, rows: list[Any], scope: VoiceScope) -> Any:
    """The row `id_or_name` means among the usable `rows`: by id, else the caller's own voice of that name,
    else the one shared voice of that name; None when there is none."""
    by_id = [row for row in rows if row["id"] == id_or_name]
    if by_id or len(rows) <= 1:
        return (by_id or rows or [None])[0]
    own = [row for row in rows if row["owner"] == scope.owner]
    if len(own) == 1:
        return own[0]
    shared = [row for row in rows if shared_of(row)]
    if not own and len(shared) == 1:
        return shared[0]
    raise AmbiguousVoice(
        f"{len(rows)} voices are named {id_or_name!r}: name the one you mean by its id "
        "(GET /v1/voices lists ids)"
    )


def name_taken(name: str) -> InputError:
    return VoiceNameTaken(
        f"you already have a voice named {name!r}: pick another name or delete that one first"
    )


def check_room(engine: sa.Engine, table: sa.Table, owner: str | None, limit: int | None) -> None:
    """InputError when `owner` already keeps `limit` voices (None: no limit, or no owner)."""
    if owner is None or limit is None:
        return
    with engine.connect() as conn:
        count = conn.execute(
            sa.select(sa.func.count()).select_from(table).where(table.c.owner == owner)
        ).scalar_one()
    if count >= limit:
        raise InputError(
            f"you keep {count} voices, the most one user may (max_voices_per_owner): delete one you no "
            "longer use, then enrol this one"
        )


def stored_json(row: Any, column: str, default: Any) -> Any:
    """A JSON column of a voice's row; `default` (logged) when the value is damaged: one such row made
    every listing of its owner's voices a 500."""
    text = row[column]
    if not text:
        return default
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        log.error("voice %s: its %s cannot be read (%s); shown as empty", row["id"], column, exc)
        return default


def stored_defaults(row: Any) -> VoiceDefaults:
    """A voice's defaults as stored (the ones this version knows; none when damaged)."""
    stored = stored_json(row, "defaults", {})
    known = {field.name for field in dataclasses.fields(VoiceDefaults)}
    return (
        VoiceDefaults(**{k: v for k, v in stored.items() if k in known})
        if isinstance(stored, dict)
        else (VoiceDefaults())
    )
