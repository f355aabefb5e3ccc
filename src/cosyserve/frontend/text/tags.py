"""The markup that reaches the LM as single special tokens, and how to keep text processing off it.

Two kinds of special token can appear in user text:
- control tags: `[breath]`, `[laughter]`, `<strong>`…`</strong>`, `[cough]`, … (fine-grained control);
- pronunciation tokens: pinyin initials and toned finals (`[j][ǐ]`, `[h][ào]`) and CMU phones
  (`[M][AY0]`).
Both are matched by the tokenizer on the raw (NFC) text, so normalisation, splitting and Japanese
conversion must leave them byte-for-byte intact: `split_protected` cuts a text into plain chunks and
protected tokens, and the processing steps only touch the plain chunks.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

from cosyserve.frontend.tokenizer import COSYVOICE3_SPECIAL_TOKENS

_FIRST_PRONUNCIATION = COSYVOICE3_SPECIAL_TOKENS.index("<|endofsystem|>") + 1

# `[breath]`, `<strong>`, … : everything between the `<|…|>` markers and the phone tokens.
CONTROL_TAGS: frozenset[str] = frozenset(
    token for token in COSYVOICE3_SPECIAL_TOKENS[:_FIRST_PRONUNCIATION] if not token.startswith("<|")
)
# `[M]`, `[AY0]`, `[j]`, `[ǐ]`, … : CMU phones, pinyin initials and toned finals.
PRONUNCIATION_TOKENS: frozenset[str] = frozenset(COSYVOICE3_SPECIAL_TOKENS[_FIRST_PRONUNCIATION:])
SPECIAL_TAGS: frozenset[str] = CONTROL_TAGS | PRONUNCIATION_TOKENS
PINYIN_TOKENS: frozenset[str] = frozenset(
    t for t in PRONUNCIATION_TOKENS if not (t.isascii() and t.isupper())
)

# Opening tag -> closing tag; a sentence split never falls between the two.
PAIRED_TAGS: dict[str, str] = {"<strong>": "</strong>", "<laughter>": "</laughter>"}

# Longest first, so that `[quick_breath]` wins over any shorter token that is a prefix of it.
SPECIAL_TAG_PATTERN = re.compile(
    "|".join(re.escape(tag) for tag in sorted(SPECIAL_TAGS, key=len, reverse=True))
)
_CONTROL_TAG_PATTERN = re.compile(
    "|".join(re.escape(tag) for tag in sorted(CONTROL_TAGS, key=len, reverse=True))
)
# `<|endofprompt|>`, `<|im_start|>`, … : chat markers that users must not place in their text.
MARKER_PATTERN = re.compile(r"<\|[^<>|]*\|>")


def nfc(text: str) -> str:
    """NFC form: the tokenizer matches special tokens on the raw text, so `ǐ` must be one code point."""
    return unicodedata.normalize("NFC", text)


def split_protected(text: str) -> list[tuple[str, bool]]:
    """Cut `text` into `(chunk, is_special_tag)` pairs, in order; joining the chunks gives `text` back."""
    pieces: list[tuple[str, bool]] = []
    position = 0
    for match in SPECIAL_TAG_PATTERN.finditer(text):
        if match.start() > position:
            pieces.append((text[position : match.start()], False))
        pieces.append((match.group(), True))
        position = match.end()
    if position < len(text):
        pieces.append((text[position:], False))
    return pieces


def map_plain(text: str, transform: Callable[[str], str]) -> str:
    """Apply `transform(str) -> str` to each stretch of `text` between special tags; tags stay as they are."""
    return "".join(chunk if is_tag else transform(chunk) for chunk, is_tag in split_protected(text))


def strip_tags(text: str) -> str:
    """`text` without its special tags (what is left to be read as ordinary text)."""
    return SPECIAL_TAG_PATTERN.sub("", text)


def strip_control_tags(text: str) -> str:
    """`text` without `[breath]`, `<strong>`, … but with its pronunciation tokens (they are spoken)."""
    return _CONTROL_TAG_PATTERN.sub("", text)
