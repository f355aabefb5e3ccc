"""The text preview: how the model will read a text before it is synthesised, computed on the service side.

It runs the frontend's `describe_text` (the same normalisation, split and tokens as synthesis) with the
loaded model's tokenizer and, for a saved voice, its transcript, instruction and lexicon, and hands back a
`TextPreview` whose every part is ready to show: the spoken form cut into plain text, native pronunciation
tokens (`[ch][óng]`) and control tags, the corrections, the instruction, the sentences and the LM's token
pieces. The web UI only renders it (`ui/preview.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cosyserve.errors import CosyServeError, InputError
from cosyserve.frontend.text.corrections import Correction
from cosyserve.frontend.text.describe import TextDescription, describe_text
from cosyserve.frontend.text.split import split_long_text
from cosyserve.frontend.text.tags import PRONUNCIATION_TOKENS
from cosyserve.service.access.principals import AuthRequired, Principal

if TYPE_CHECKING:
    from cosyserve.service.assembly import Service

PLAIN, PRONUNCIATION, TAG = "plain", "pronunciation", "tag"
_BRACKETED = re.compile(r"\[[^\[\]\n]+\]|<[^<>\n]+>")


@dataclass(frozen=True)
class Span:
    """A run of spoken text and what it is: PLAIN words, a native PRONUNCIATION token or a control TAG."""

    text: str
    kind: str


@dataclass(frozen=True)
class TextPreview:
    """What the model will read for one text, each part ready to show."""

    mode: str  # "zero_shot", "cross_lingual" or "instruct"
    spoken: tuple[Span, ...]  # the text after normalisation, before the sentence split
    corrections: tuple[Correction, ...]  # where it reads differently from the official normaliser, and why
    instruction: str | None  # the instruction actually used
    segments: tuple[tuple[Span, ...], ...]  # the sentence split: one LM call each
    lm_pieces: tuple[tuple[str, ...], ...]  # the token pieces of each LM input, prefixes included
    warnings: tuple[str, ...]
    written: tuple[str, ...] | None = None  # the typed text of each segment, when asked for


def spans(spoken: str) -> tuple[Span, ...]:
    """`spoken` cut into plain text, pronunciation tokens and control tags (empty runs left out)."""
    found: list[Span] = []
    position = 0
    for match in _BRACKETED.finditer(spoken):
        if match.start() > position:
            found.append(Span(spoken[position : match.start()], PLAIN))
        token = match.group()
        found.append(Span(token, PRONUNCIATION if token in PRONUNCIATION_TOKENS else TAG))
        position = match.end()
    if position < len(spoken):
        found.append(Span(spoken[position:], PLAIN))
    return tuple(found)


def preview_of(description: TextDescription) -> TextPreview:
    return TextPreview(
        mode=description.mode,
        spoken=spans(description.spoken),
        corrections=description.corrections,
        instruction=description.instruction,
        segments=tuple(spans(segment) for segment in description.segments),
        lm_pieces=tuple(lm.pieces for lm in description.lm_inputs),
        warnings=description.warnings,
        written=description.written,
    )


@dataclass(frozen=True)
class ReadingFields:
    """The fields of a synthesis tab that decide how its text is read."""

    mode: str  # "zero_shot", "cross_lingual" or "instruct"
    voice: str | None = None  # a saved voice's id or name (None: an uploaded recording)
    transcript: str | None = None  # the recording's transcript
    instruct: str | None = None  # the instruction typed
    preset: str | None = None  # the instruction chosen from the presets


def reading_inputs(fields: ReadingFields) -> tuple[str | None, str | None]:
    """(prompt text, instruction) a synthesis tab's fields give the reading: a saved voice brings its own
    transcript (None), cross-lingual reads none (""), only the instruct tab has an instruction, and a
    zero-shot recording whose transcript is still missing is previewed as zero-shot anyway."""
    mode, voice, instruct, preset = fields.mode, fields.voice, fields.instruct, fields.preset
    prompt_text = None if voice else ((fields.transcript or "").strip() or None)
    if mode == "cross_lingual":
        prompt_text = ""
    instruction = ((instruct or "").strip() or (preset or "").strip() or None) if mode == "instruct" else ""
    if mode == "zero_shot" and not voice and prompt_text is None:
        prompt_text = "…"
    return prompt_text, instruction or None


def describe(
    service: Service,
    principal: Principal | None,
    text: str,
    *,
    prompt_text: str | None,
    instruct: str | None,
    voice: str | None,
    with_written: bool = False,
) -> TextDescription:
    """How the model will read `text` (`describe_text`) with a saved voice's transcript, instruction and
    lexicon when one is given (a voice `principal` may use; None: no saved voice at all); InputError for
    text the synthesis would refuse too, or when no model is loaded yet."""
    synth = service.model.loaded if service.model is not None else None
    if synth is None:
        raise InputError("the text preview needs the model loaded on this server: try again when it is ready")
    lexicon = None
    if voice:
        if principal is None:
            raise AuthRequired("not signed in: log in again")
        saved = service.voices.get(voice, principal.voices)
        prompt_text = saved.transcript if prompt_text is None else prompt_text
        instruct = instruct if instruct is not None else saved.defaults.instruct
        lexicon = saved.lexicon or None
    return describe_text(
        text,
        synth.tokenizer,
        prompt_text=prompt_text,
        instruct=instruct,
        lexicon=lexicon,
        max_chars=None,
        with_written=with_written,
    )


def text_preview(
    service: Service,
    principal: Principal | None,
    text: str,
    fields: ReadingFields,
    with_written: bool = False,
) -> TextPreview:
    """The preview of `text` as a synthesis tab with these fields would send it (see `reading_inputs`);
    `with_written` adds the typed text of each sentence (to pair them with a result's timings)."""
    prompt_text, instruction = reading_inputs(fields)
    description = describe(
        service,
        principal,
        text,
        prompt_text=prompt_text,
        instruct=instruction,
        voice=fields.voice,
        with_written=with_written,
    )
    return preview_of(description)


def sentence_total(service: Service, text: str) -> int:
    """How many sentences a long-text job will speak: its pieces, each split as synthesis splits it (a
    piece that can't be described counts as one)."""
    total = 0
    for piece in split_long_text(text, service.settings.limits.max_text_chars):
        try:
            total += len(describe(service, None, piece, prompt_text="", instruct=None, voice=None).segments)
        except CosyServeError:
            total += 1
    return max(1, total)
