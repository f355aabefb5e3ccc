"""What the model will read for a text: the spoken form, the sentence split and the tokens of each LM input.

`describe_text` runs the same frontend as synthesis (`prepare_texts`) and adds what a user needs to check a
reading: where cosyserve reads differently from the official normaliser, what the official would read, and
the token pieces of every text the LM gets. `cosyserve normalize` prints it; a synthesis report can carry it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cosyserve.frontend.text.corrections import Correction
from cosyserve.frontend.text.japanese import to_katakana
from cosyserve.frontend.text.lexicon import Lexicon
from cosyserve.frontend.text.normalize import Language, normalize_report
from cosyserve.frontend.text.prepare import DEFAULT_MAX_CHARS, PreparedText, prepare_texts
from cosyserve.frontend.text.prompts import inline_instruction, leading_tag_instruction
from cosyserve.frontend.text.pronunciation import convert_pronunciations
from cosyserve.frontend.text.split import drop_invisible
from cosyserve.frontend.tokenizer import TextTokenizer


@dataclass(frozen=True)
class TokenizedText:
    """One text as the LM gets it, and its tokens."""

    text: str
    token_ids: tuple[int, ...]
    pieces: tuple[str, ...]  # the tokens as text; a character split over several tokens is one piece


@dataclass(frozen=True)
class TextDescription:
    """How one request's text is read, from what was typed to the LM's tokens."""

    typed: str
    language: Language
    spoken: str  # the text after normalisation, before the sentence split (instructions removed)
    official: str  # what the official normalisation reads for the same text
    corrections: tuple[Correction, ...]  # where `spoken` differs from `official`, and why
    segments: tuple[str, ...]  # the sentence split: one LM call each
    mode: str  # "zero_shot", "cross_lingual" or "instruct"
    instruction: str | None
    prompt: TokenizedText | None  # read once before each segment; None in cross-lingual mode
    lm_inputs: tuple[TokenizedText, ...]  # one per segment, prefixes included
    warnings: tuple[str, ...]
    # what was typed for each segment, as a result's timings name them (only when asked: it reads the
    # text again, about a third of the time the rest takes)
    written: tuple[str, ...] | None = None


def describe_text(
    text: str,
    tokenizer: TextTokenizer,
    *,
    prompt_text: str | None = None,
    instruct: str | None = None,
    lexicon: Lexicon | Mapping[str, str] | None = None,
    max_chars: int | None = DEFAULT_MAX_CHARS,
    with_written: bool = False,
) -> TextDescription:
    """Describe how `text` is read in the mode its inputs select (arguments as for `prepare_texts`);
    `with_written` adds the typed text of each segment.

    Raises InputError where synthesis would (empty or too long text, bad pronunciations).
    """
    if lexicon is not None and not isinstance(lexicon, Lexicon):
        lexicon = Lexicon(lexicon)
    prepared = prepare_texts(
        text,
        tokenizer=tokenizer,
        prompt_text=prompt_text,
        instruct=instruct,
        lexicon=lexicon,
        max_chars=max_chars,
    )
    report = normalize_report(_plain_body(drop_invisible(text), lexicon), with_official=True)
    prompt = _tokenized(prepared.lm_prompt_text, tokenizer) if prepared.lm_prompt_text else None
    return TextDescription(
        typed=text,
        language=report.language,
        spoken=report.spoken,
        official=report.official or "",
        corrections=report.corrections,
        segments=tuple(prepared.display_segments),
        mode=prepared.mode,
        instruction=prepared.instruction,
        prompt=prompt,
        lm_inputs=tuple(_tokenized(segment, tokenizer) for segment in prepared.segments),
        warnings=tuple(prepared.warnings),
        written=tuple(prepared.written_segments) if with_written else None,
    )


def reading_report(prepared: PreparedText, tokenizer: TextTokenizer) -> dict[str, Any]:
    """What the model read for one synthesis, JSON-ready for its report (the output's manifest): the
    mode and instruction, each segment as spoken, as the LM got it, and its token pieces."""
    return {
        "mode": prepared.mode,
        "instruction": prepared.instruction,
        "spoken": list(prepared.display_segments),
        "lm_text": list(prepared.segments),
        "lm_tokens": [readable_pieces(ids, tokenizer) for ids in prepared.segment_ids],
    }


def _plain_body(text: str, lexicon: Lexicon | None) -> str:
    """The text that `prepare_texts` normalises: instructions removed, lexicon, pronunciations, katakana."""
    _, body = inline_instruction(text)
    _, body = leading_tag_instruction(body)
    if lexicon is not None:
        body = lexicon.apply(body)
    return to_katakana(convert_pronunciations(body))


def _tokenized(text: str, tokenizer: TextTokenizer) -> TokenizedText:
    ids = tokenizer.encode(text)
    return TokenizedText(text, tuple(ids), tuple(readable_pieces(ids, tokenizer)))


def readable_pieces(ids: list[int], tokenizer: TextTokenizer) -> list[str]:
    """The text of each token; tokens holding part of a character's bytes are joined until it is whole."""
    pieces: list[str] = []
    pending: list[int] = []
    for token_id in ids:
        pending.append(token_id)
        piece = tokenizer.decode(pending, skip_special_tokens=False)
        if "\ufffd" not in piece or len(pending) >= 4:  # a UTF-8 character has at most 4 bytes
            pieces.append(piece)
            pending = []
    if pending:
        pieces.append(tokenizer.decode(pending, skip_special_tokens=False))
    return pieces
