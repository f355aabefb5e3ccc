"""What a voice's own fields may hold: its name, transcript and lexicon, checked before they are stored."""

from __future__ import annotations

import json
import re

from cosyserve.errors import InputError

NAME_PATTERN = re.compile(r"^[\w\-. \u3000-\u9fff]{1,64}$")
MAX_TRANSCRIPT_CHARS = 500
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # NUL (PostgreSQL refuses it), lone surrogates (not UTF-8)


def check_name(name: str) -> str:
    name = (name or "").strip()
    if not NAME_PATTERN.fullmatch(name):
        raise InputError(
            "a voice name must be 1-64 letters, digits, spaces, '-', '_', '.' or Chinese characters"
        )
    if not name.strip(". "):  # ".", "..": path-like names a file browser or a URL would misread
        raise InputError(f"a voice name must have a letter, digit or character besides dots: {name!r}")
    return name


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
    text = json.dumps(lexicon, ensure_ascii=False)  # NUL comes out escaped; lone surrogates would not
    if UNSTORABLE.search(text):
        raise InputError("a lexicon entry contains a lone surrogate (not valid Unicode text); remove it")
    return text
