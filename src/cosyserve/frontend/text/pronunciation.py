"""Pronunciation inpainting: turn the ways users write a pronunciation into the model's native tokens.

The LM knows pinyin as an initial token plus a final token that carries the tone mark, spelled the way
the syllable is written: `[h][ào]` (hào), `[j][ǐ]` (jǐ), `[y][uè]` (yuè), `[w][ǒ]` (wǒ), `[l][ǜ]` (lǜ),
`[l][vè]` (lüè); a syllable without an initial is its final alone (`[ài]`), and the neutral tone is the
bare final (`[de]` is `[d][e]`). English is CMU phones with stress digits: `[M][AY0][N][UW1][T]`.

Accepted forms, all converted to native tokens:
- native tokens, kept as written: `[j][ǐ]`, `[M][AY0][N][UW1][T]`;
- a word with its pinyin: `[重庆][chóng qìng]`, `[重庆](chóng qìng)`, `[重庆][zhong4 qing4]`
  (tone numbers 1-4, 5 or 0 or none for the neutral tone, `v` or `u:` for ü);
- an English word with its CMU phones: `[minute][M AY0 N UW1 T]`.
The word itself is replaced by the tokens: the LM reads the tokens instead of the characters.
Anything in brackets that looks like a phone but is not one of the model's tokens raises InputError.
"""

from __future__ import annotations

import re
import unicodedata

from cosyserve.errors import InputError
from cosyserve.frontend.text.tags import PRONUNCIATION_TOKENS, SPECIAL_TAGS, nfc

# Longest first: `zh` before `z`. `y` and `w` are initials in the model's spelling.
PINYIN_INITIALS: tuple[str, ...] = (
    *("zh", "ch", "sh", "b", "p", "m", "f", "d", "t", "n", "l", "g"),
    *("k", "h", "j", "q", "x", "r", "z", "c", "s", "y", "w"),
)
_PHONES = {token[1:-1] for token in PRONUNCIATION_TOKENS}
CMU_PHONES: frozenset[str] = frozenset(phone for phone in _PHONES if phone.isascii() and phone.isupper())
PINYIN_FINALS: frozenset[str] = frozenset(_PHONES - CMU_PHONES - set(PINYIN_INITIALS))

_TONE_MARKS = {
    "a": "āáǎà",
    "e": "ēéěè",
    "i": "īíǐì",
    "o": "ōóǒò",
    "u": "ūúǔù",
    "ü": "ǖǘǚǜ",
}
_UNMARK = {
    marked: (vowel, tone + 1) for vowel, marks in _TONE_MARKS.items() for tone, marked in enumerate(marks)
}
_PINYIN_LETTERS = set("abcdefghijklmnopqrstuvwxyzü")
_PINYIN_ALONE = frozenset({"de", "le", "ma", "ne", "ba", "zi", "men"})  # neutral-tone syllables, no digit
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")

HOW_TO = (
    "write pinyin as an initial and a toned final, e.g. [h][ào] or [j][ǐ], or as a word with its pinyin, "
    "e.g. [重庆][chóng qìng] or [重庆][chong2 qing4]; write English as CMU phones with stress digits, "
    "e.g. [M][AY0][N][UW1][T] or [minute][M AY0 N UW1 T]"
)


def pinyin_to_tokens(syllable: str) -> list[str]:
    """Native tokens for one pinyin syllable: `"chóng"` or `"chong2"` -> `["[ch]", "[óng]"]`."""
    original = syllable
    syllable = nfc(syllable.strip().lower()).replace("u:", "ü").replace("v", "ü")
    tone = 5
    if syllable[-1:] in ("0", "1", "2", "3", "4", "5"):
        tone = int(syllable[-1]) or 5
        syllable = syllable[:-1]
    letters = []
    for char in syllable:
        if char in _UNMARK:
            vowel, marked_tone = _UNMARK[char]
            if tone != 5 and tone != marked_tone:
                raise InputError(f"pinyin syllable {original!r} has two tones: give it one")
            tone = marked_tone
            char = vowel
        letters.append(char)
    base = "".join(letters)
    if not base or any(char not in _PINYIN_LETTERS for char in base):
        raise InputError(f"{original!r} is not a pinyin syllable: {HOW_TO}")
    initial = next((i for i in PINYIN_INITIALS if base.startswith(i) and len(base) > len(i)), "")
    final = base[len(initial) :]
    if initial in ("j", "q", "x", "y"):
        final = final.replace("ü", "u")  # ju, qu, xu, yu are spelled with u
    final = final.replace("üe", "ve")  # lüè, nüè: the model spells this final `vè`
    marked = _place_tone(final, tone)
    if marked not in PINYIN_FINALS:
        tone_name = "the neutral tone" if tone == 5 else f"tone {tone}"
        raise InputError(
            f"pinyin syllable {original!r}: the model has no token for the final {final!r} in {tone_name} "
            f"([{marked}] is unknown); use another tone or spelling, or {HOW_TO}"
        )
    return ([f"[{initial}]"] if initial else []) + [f"[{marked}]"]


def _place_tone(final: str, tone: int) -> str:
    """Put the tone mark where pinyin puts it: on a or e, on the o of ou, else on the last vowel."""
    if tone == 5:
        return final
    if "a" in final:
        index = final.index("a")
    elif "e" in final:
        index = final.index("e")
    elif "ou" in final:
        index = final.index("o")
    else:
        vowels = [i for i, char in enumerate(final) if char in _TONE_MARKS]
        if not vowels:
            return final  # no vowel (e.g. `ng`): left unmarked, rejected as unknown by the caller
        index = vowels[-1]
    return final[:index] + _TONE_MARKS[final[index]][tone - 1] + final[index + 1 :]


def cmu_to_tokens(phones: str) -> list[str]:
    """Native tokens for space-separated CMU phones: `"M AY0 N"` -> `["[M]", "[AY0]", "[N]"]`."""
    tokens = []
    for phone in phones.split():
        if phone not in CMU_PHONES:
            raise InputError(f"{phone!r} is not a CMU phone the model knows (e.g. M, AY0, UW1): {HOW_TO}")
        tokens.append(f"[{phone}]")
    return tokens


def spec_to_tokens(spec: str) -> list[str]:
    """Native tokens for a pronunciation written as pinyin syllables, CMU phones or native tokens.

    Accepts `"chóng qìng"`, `"zhong4 qing4"`, `"[chóng qìng]"`, `"M AY0 N UW1 T"`, `"[zh][òng]"`.
    Raises InputError naming what cannot be converted.
    """
    spec = nfc(spec.strip())
    if re.fullmatch(r"(\[[^\[\]]+\])+", spec) and spec.count("[") > 1:
        tokens = re.findall(r"\[[^\[\]]+\]", spec)
        unknown = [token for token in tokens if token not in PRONUNCIATION_TOKENS]
        if unknown:
            raise InputError(f"unknown pronunciation token(s) {' '.join(unknown)}: {HOW_TO}")
        return tokens
    if spec.startswith("[") and spec.endswith("]"):
        spec = spec[1:-1]
    parts = [part for part in re.split(r"[\s,，'’]+", spec) if part]
    if not parts:
        raise InputError(f"the pronunciation {spec!r} is empty: {HOW_TO}")
    if all(part.isascii() and part.isupper() for part in parts):
        return cmu_to_tokens(" ".join(parts))
    return [token for part in parts for token in pinyin_to_tokens(part)]


def looks_like_phone(content: str) -> bool:
    """Is a bracketed word clearly an attempt at a phone token (`zhong4`, `hǎo`, `AY3`), not a word?"""
    content = nfc(content)
    if re.fullmatch(r"[A-Z]{1,2}[0-9]", content):
        return True
    if re.fullmatch(r"[a-zü:]+[0-5]", content):
        return True
    return (
        bool(content)
        and any(char in _UNMARK for char in content)
        and all(char in _UNMARK or char in _PINYIN_LETTERS or char == ":" for char in content.lower())
    )


def _is_spelling(content: str) -> bool:
    """Could the text after a bracketed word be a pronunciation (letters, tone digits, spaces)?"""
    content = nfc(content)
    return any(char.isalpha() for char in content) and all(
        char.isspace()
        or char in ",'’:"
        or char.isdigit()
        or (
            unicodedata.category(char).startswith("L")
            and (char.isascii() or char.lower() in _UNMARK or char.lower() == "ü")
        )
        for char in content
    )


# A bracketed item and, optionally, a spelling right after it: `[word][spelling]` or `[word](spelling)`.
_ITEM = re.compile(r"\[([^\[\]\n]*)\](?:[ \t]*(?:\[([^\[\]\n]*)\]|[(（]([^()（）\n]*)[)）]))?")


def convert_pronunciations(text: str, words: dict[str, str] | None = None) -> str:
    """Replace word forms with native tokens and check every phone-like bracket; see the module doc.

    `words`, when given, collects native tokens -> the word they replaced (`written_form` reverses it).
    Raises InputError for a word form whose spelling cannot be converted and for bracketed phones that
    are not model tokens (`[zhong4]`, `[zh][ong9]`, `[AY3]`). Other bracketed words are left alone.
    """
    text = nfc(text)
    out: list[str] = []
    position = 0
    previous_end, previous_was_phone = -1, False
    while True:
        match = _ITEM.search(text, position)
        if match is None:
            break
        word = match.group(1)
        first = f"[{word}]"
        spelling = match.group(2) if match.group(2) is not None else match.group(3)
        out.append(text[position : match.start()])
        if first in SPECIAL_TAGS or spelling is None or not _is_spelling(spelling):
            # Only the first bracket is consumed here; a second one is looked at on the next round.
            end = match.start() + len(first)
            if first not in SPECIAL_TAGS:
                _check_not_phone(text, word, match.start(), end, previous_end, previous_was_phone)
                _check_spelling_after(text, word, end, spelling)
            out.append(first)
            previous_end, previous_was_phone = end, first in PRONUNCIATION_TOKENS
            position = end
            continue
        tokens = spec_to_tokens(spelling)
        check_syllable_count(word, spelling, tokens)
        out.append("".join(tokens))
        if words is not None and word.strip():
            words.setdefault("".join(tokens), word.strip())
        previous_end, previous_was_phone = match.end(), True
        position = match.end()
    out.append(text[position:])
    return "".join(out)


def _check_not_phone(
    text: str, word: str, start: int, end: int, previous_end: int, previous_was_phone: bool
) -> None:
    next_match = re.match(r"\[([^\[\]\n]*)\]", text[end:])
    next_is_phone = next_match is not None and next_match.group() in PRONUNCIATION_TOKENS
    touches_phone = (previous_end == start and previous_was_phone) or next_is_phone
    if _looks_like_spelling_alone(word):
        try:
            hint = f" (or as tokens: {''.join(spec_to_tokens(word))})"
        except InputError:
            hint = ""
        example = "[minute]" if any(part in CMU_PHONES for part in word.split()) else "[重庆]"
        raise InputError(
            f"[{word}] is a pronunciation without its word, so its letters would be read out: write the "
            f"word first, e.g. {example}[{word}]{hint}"
        )
    if looks_like_phone(word) or (touches_phone and re.fullmatch(r"[\w:]+", word)):
        try:
            hint = f"did you mean {''.join(spec_to_tokens(word))}? "
        except InputError:
            hint = ""
        raise InputError(f"[{word}] is not a pronunciation token the model knows: {hint}{HOW_TO}")


# A spelling that starts after a bracketed word and is never closed on its line: `[重庆][chóng qìng`.
_OPEN_SPELLING = re.compile(r"[ \t]*(?:\[([^\[\]\n]*)|[(（]([^()（）\n]*))$", re.MULTILINE)


def _check_spelling_after(text: str, word: str, end: int, spelling: str | None) -> None:
    """Refuse an empty spelling after a word (`[重庆][]`) and a pinyin or CMU spelling that is never
    closed (`[重庆](chong2`): either way the brackets and letters would be read out."""
    if spelling is not None and not spelling.strip():
        raise InputError(f"[{word}] is followed by an empty pronunciation: {HOW_TO}")
    dangling = _OPEN_SPELLING.match(text, end)
    if dangling is None:
        return
    content = dangling.group(1) if dangling.group(1) is not None else dangling.group(2)
    if any(looks_like_phone(part) or part in CMU_PHONES for part in content.split()):
        shown = dangling.group().strip()
        raise InputError(
            f"the pronunciation after [{word}] is not closed ({shown!r}), so its letters would be read "
            f"out: close it, e.g. [{word}]{shown}{']' if shown.startswith('[') else ')'}"
        )


def _looks_like_spelling_alone(word: str) -> bool:
    """Several syllables or phones in one bracket with no word before it (`[chong2 qing4]`): its letters
    and tone digits would be read out as written."""
    parts = word.split()
    return (
        len(parts) > 1
        and any(looks_like_phone(part) for part in parts)
        and all(
            looks_like_phone(part) or part in CMU_PHONES or part.lower() in _PINYIN_ALONE for part in parts
        )
    )


def check_syllable_count(word: str, spelling: str, tokens: list[str]) -> None:
    """A Chinese word needs one syllable per character; a mismatch is almost always a typo."""
    if not word or not all(_HAN.match(char) for char in word):
        return
    if any(token[1:-1] in CMU_PHONES for token in tokens):
        raise InputError(f"[{word}] is Chinese but its pronunciation {spelling!r} is CMU phones: use pinyin")
    syllables = sum(token[1:-1] in PINYIN_FINALS for token in tokens)
    if syllables != len(word):
        raise InputError(
            f"[{word}][{spelling}]: {len(word)} characters but {syllables} pinyin syllables; "
            "give one syllable per character, separated by spaces"
        )


_TOKEN = re.compile(r"\[[^\[\]\n]+\]")


def written_form(text: str, words: dict[str, str] | None = None) -> str:
    """`text` with native pronunciation tokens turned back into what a reader expects: the word they
    replaced where `words` (tokens -> word) knows it, else the syllable (`[h][ào]` -> `hào`) or the phones
    (`[M][AY0]` -> `M AY0`). For subtitles and timings: a user never sees the LM's tokens."""
    known = words or {}
    longest = max((key.count("[") for key in known), default=0)
    out: list[str] = []
    position = 0
    while (match := _TOKEN.search(text, position)) is not None:
        run = [match]
        while (following := _TOKEN.match(text, run[-1].end())) and following.group() in PRONUNCIATION_TOKENS:
            run.append(following)
        out.append(text[position : match.start()])
        position = run[-1].end()
        if match.group() not in PRONUNCIATION_TOKENS:
            out.append(match.group())
            position = match.end()
            continue
        out.append(_readable_run([m.group() for m in run], known, longest))
    out.append(text[position:])
    return "".join(out)


def _readable_run(tokens: list[str], words: dict[str, str], longest: int) -> str:
    parts: list[str] = []
    index, after_phone = 0, False
    while index < len(tokens):
        for end in range(min(len(tokens), index + longest), index, -1):
            word = words.get("".join(tokens[index:end]))
            if word is not None:
                parts.append(word)
                index, after_phone = end, False
                break
        else:
            phone = tokens[index][1:-1]
            if phone in CMU_PHONES:
                parts.append((" " if after_phone else "") + phone)
                after_phone = True
                index += 1
                continue
            if phone in PINYIN_INITIALS and index + 1 < len(tokens):
                parts.append(phone + tokens[index + 1][1:-1])
                index += 1
            else:
                parts.append(phone)
            index, after_phone = index + 1, False
    return "".join(parts)
