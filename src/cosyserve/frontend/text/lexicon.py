"""A pronunciation lexicon: words that should always be read a given way, compiled to native tokens.

    lexicon = Lexicon({"重庆": "chóng qìng", "行长": "hang2 zhang3", "minute": "M AY0 N UW1 T"})
    lexicon.apply("重庆的行长") == "[ch][óng][q][ìng]的[h][áng][zh][ǎng]"

Pronunciations are written as for `pronunciation.spec_to_tokens`: pinyin with tone marks or numbers,
CMU phones, optionally in brackets, or native tokens. Entries are checked when the lexicon is built.
Matching is case-insensitive, longest word first, whole words only for Latin-script words, and never
inside bracketed or `<…>` markup already in the text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from cosyserve.errors import InputError, LexiconError
from cosyserve.frontend.text.pronunciation import check_syllable_count, spec_to_tokens
from cosyserve.frontend.text.tags import nfc

# Markup the lexicon must not rewrite: bracketed items (with a `(spelling)` after them) and `<…>` tags.
_MARKUP = re.compile(r"\[[^\[\]\n]*\](?:[ \t]*[(（][^()（）\n]*[)）])?|<[^<>\n]*>")
_WORD_CHAR = re.compile(r"[A-Za-z0-9_]")
# a reading written as in a text, [word][reading] or [word](reading)
_IN_TEXT = re.compile(r"\[([^\[\]]+)\]\s*[\[(（]([^\[\]()（）]+)[\])）]")
# A lexicon is a voice's list of words it reads its own way, compiled again for each synthesis with it: one
# of 500,000 entries held a server for minutes and gigabytes, and a pronunciation of 40,000 syllables saved
# fine and then refused every text holding its word (more LM positions than the model has).
MAX_ENTRIES = 2000
MAX_WORD_CHARS = 64
MAX_SPEC_CHARS = 300


def check_lexicon_size(entries: Mapping[object, object]) -> None:
    """InputError for a lexicon with more entries than `MAX_ENTRIES` (before any entry is compiled)."""
    if len(entries) > MAX_ENTRIES:
        raise LexiconError(
            f"a lexicon may have at most {MAX_ENTRIES} entries, got {len(entries)}: keep the words this "
            "voice misreads, or write a pronunciation into the text itself ([重庆][chóng qìng])"
        )


def read_lexicon_file(path: Path) -> dict[str, str]:
    """The entries of a server-wide lexicon file (a JSON object of word -> pronunciation), checked as a
    voice's are. ValueError saying what is wrong with the file."""
    try:
        entries = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"lexicon file {path} cannot be read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(
            f'lexicon file {path} is not UTF-8 JSON ({exc}): write an object such as {{"重庆": "chóng qìng"}}'
        ) from None
    if not isinstance(entries, dict) or not all(isinstance(v, str) for v in entries.values()):
        raise ValueError(f"lexicon file {path} must hold one JSON object of word -> pronunciation strings")
    try:
        Lexicon(entries)
    except InputError as exc:
        raise ValueError(f"lexicon file {path}: {exc}") from None
    return entries


class Lexicon:
    """Word -> native pronunciation tokens; see the module doc."""

    def __init__(self, entries: Mapping[str, str]) -> None:
        check_lexicon_size(entries)
        compiled: dict[str, str] = {}
        for raw_word, spec in entries.items():
            word = nfc(str(raw_word)).strip()
            if not word or any(char in word for char in "[]()<>\n") or not word.isprintable():
                raise LexiconError(
                    f"lexicon word {raw_word!r} is empty or holds brackets or control characters: give the "
                    "plain word, e.g. 重庆"
                )
            if len(word) > MAX_WORD_CHARS:
                raise LexiconError(
                    f"lexicon word {word[:20]!r}… has {len(word)} characters; at most {MAX_WORD_CHARS}"
                )
            if not isinstance(spec, str) or not spec.strip():
                raise LexiconError(f"lexicon entry {word!r} has no pronunciation: give pinyin or CMU phones")
            if len(spec) > MAX_SPEC_CHARS:
                raise LexiconError(
                    f"lexicon entry {word!r}: its pronunciation has {len(spec)} characters; at most "
                    f"{MAX_SPEC_CHARS}"
                )
            spec = _reading_alone(word, spec)
            try:
                tokens = spec_to_tokens(spec)
                check_syllable_count(word, spec, tokens)
            except InputError as exc:
                raise LexiconError(
                    f"lexicon entry {word!r}: {exc}. A lexicon gives the reading alone: "
                    f'{{"重庆": "chóng qìng"}}, {{"行长": "hang2 zhang3"}}, {{"minute": "M AY0 N UW1 T"}}'
                ) from exc
            compiled[word.lower()] = "".join(tokens)
        self._tokens = compiled
        self._pattern = _word_pattern(compiled) if compiled else None

    @property
    def entries(self) -> dict[str, str]:
        """Word (lower-cased) -> native tokens, e.g. `{"重庆": "[ch][óng][q][ìng]"}`."""
        return dict(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def apply(self, text: str) -> str:
        """`text` with every lexicon word replaced by its tokens; existing markup is left alone."""
        if self._pattern is None:
            return text
        text = nfc(text)
        out = []
        position = 0
        for markup in _MARKUP.finditer(text):
            out.append(self._replace(text[position : markup.start()]))
            out.append(markup.group())
            position = markup.end()
        out.append(self._replace(text[position:]))
        return "".join(out)

    def _replace(self, plain: str) -> str:
        if self._pattern is None:
            return plain
        return self._pattern.sub(lambda match: self._tokens[match.group().lower()], plain)


def _reading_alone(word: str, spec: str) -> str:
    """The reading of `spec`, also when it is written as in a text, with its word in front:
    `[重庆][chóng qìng]` or `[重庆](chong2 qing4)` for the word 重庆 is `chóng qìng`."""
    written = _IN_TEXT.fullmatch(nfc(spec).strip())
    if written is not None and written.group(1).strip().lower() == word.lower():
        return written.group(2)
    return spec


def _word_pattern(tokens: dict[str, str]) -> re.Pattern[str]:
    alternatives = []
    for word in sorted(tokens, key=len, reverse=True):
        pattern = re.escape(word)
        if _WORD_CHAR.match(word[0]):
            pattern = r"(?<![A-Za-z0-9_'])" + pattern
        if _WORD_CHAR.match(word[-1]):
            pattern += r"(?![A-Za-z0-9_])"
        alternatives.append(pattern)
    return re.compile("|".join(alternatives), re.IGNORECASE)
