"""From what a user typed to what the LM reads: one call that runs the whole text frontend.

Order: chat markers and a typed system sentence removed → instruction found (explicit, a leading tag, or
text before `<|endofprompt|>`) → length check → lexicon → pronunciation forms to native tokens →
Japanese to katakana → normalisation → split into segments → mode assembly → token ids (the one place
the LM's texts are tokenised).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from cosyserve.errors import InputError, TextError, TextTooLong
from cosyserve.frontend.text.japanese import to_katakana
from cosyserve.frontend.text.lexicon import Lexicon
from cosyserve.frontend.text.normalize import Language, normalize_text, text_language
from cosyserve.frontend.text.prompts import (
    assemble_lm_texts,
    find_preset,
    inline_instruction,
    leading_tag_instruction,
    paraphrased_preset,
    resolve_instruction,
    strip_system_markers,
)
from cosyserve.frontend.text.pronunciation import convert_pronunciations, written_form
from cosyserve.frontend.text.split import (
    Encoder,
    drop_invisible,
    require_visible_text,
    short_text_warning,
    split_text,
)
from cosyserve.frontend.text.tags import nfc
from cosyserve.frontend.text.typed import typed_segments
from cosyserve.limits import DEFAULT_MAX_TEXT_CHARS, MAX_INSTRUCT_CHARS

DEFAULT_MAX_CHARS = DEFAULT_MAX_TEXT_CHARS  # `cosyserve.limits`


def check_length(text: str, limit: int = DEFAULT_MAX_CHARS) -> None:
    """Raise InputError when `text` has more than `limit` characters (as typed, before normalisation)."""
    count = len(nfc(text).strip())
    if count > limit:
        raise TextTooLong(
            f"text is {count} characters, the limit is {limit}: split it, send a longer text as a job "
            "(POST /v1/jobs; the web UI does so by itself), or raise the limit (`--max-chars` of the "
            "command, `--max-text-chars` or COSYSERVE_MAX_TEXT_CHARS of a server)"
        )


def check_inline_instruction(inline: str | None) -> None:
    """InputError for an instruction written before <|endofprompt|> longer than `instruct` may be."""
    if inline is not None and len(inline) > MAX_INSTRUCT_CHARS:
        raise InputError(
            f"the instruction before <|endofprompt|> has {len(inline)} characters; at most "
            f"{MAX_INSTRUCT_CHARS} are allowed, as for `instruct`: shorten it"
        )


@dataclass(frozen=True)
class PreparedText:
    """Everything the engine needs from the text side of one request."""

    lm_prompt_text: str  # read once before each segment; "" in cross-lingual mode
    segments: list[str]  # LM-ready, one LM call each (with the system prefix in cross-lingual mode)
    display_segments: list[str]  # the same segments as spoken, without prefixes (for logs)
    use_prompt_speech_tokens: bool  # True only in zero-shot mode
    mode: str  # "zero_shot", "cross_lingual" or "instruct"
    instruction: str | None  # the instruction sentence in instruct mode
    warnings: list[str] = field(default_factory=list)
    lm_prompt_ids: list[int] = field(default_factory=list)  # `lm_prompt_text` tokenised ([] when empty)
    segment_ids: list[list[int]] = field(default_factory=list)  # each of `segments` tokenised
    # Finds the typed text of each segment (`written_segments`); None: show the spoken segments.
    typed_finder: Callable[[list[str]], list[str]] | None = field(default=None, repr=False, compare=False)

    @cached_property
    def written_segments(self) -> list[str]:
        """What the user typed for each segment, for subtitles and timings (`第2课`, not `第二课`;
        pronunciations shown as the word): "" for a segment that continues the typed text of the one
        before it (see `typed`). Found on first use, as it reads the text again clause by clause; the
        synthesizer asks only once the first segment is spoken, so it never delays the first audio."""
        if self.typed_finder is None:
            return [written_form(segment) for segment in self.display_segments]
        return self.typed_finder(self.display_segments)


def convert_written(text: str, lexicon: Lexicon | None = None, words: dict[str, str] | None = None) -> str:
    """One text through lexicon, pronunciation and Japanese (what normalisation is given); `words`
    collects native tokens -> the word they stand for (see `written_form`)."""
    if lexicon is not None:
        text = lexicon.apply(text)
        if words is not None:
            words.update({tokens: word for word, tokens in lexicon.entries.items()})
    return to_katakana(convert_pronunciations(text, words))


def prepare_plain(text: str, lexicon: Lexicon | None = None, words: dict[str, str] | None = None) -> str:
    """One text through lexicon, pronunciation, Japanese and normalisation, without splitting; `words`
    collects native tokens -> the word they stand for (see `written_form`)."""
    return normalize_text(convert_written(text, lexicon, words))


def _typed_finder(body: str, lexicon: Lexicon | None, lang: Language) -> Callable[[list[str]], list[str]]:
    """How to find the typed text of each segment of `body` (read as a whole in `lang`)."""

    def read(piece: str) -> str:
        return normalize_text(convert_written(piece, lexicon), lang)

    def show(piece: str) -> str:
        """The typed words with pronunciation markup shown as the word (`[重庆](chóng qìng)` -> 重庆)."""
        words: dict[str, str] = {}
        # Checked on the whole text; a piece cut out of a pronunciation is shown as typed.
        with contextlib.suppress(InputError):
            piece = written_form(convert_pronunciations(piece, words), words)
        return " ".join(piece.split())  # one cue, one line: a blank line would end the cue in the file

    return lambda segments: typed_segments(body, segments, read=read, show=show)


def prepare_texts(
    text: str,
    *,
    tokenizer: Encoder,
    prompt_text: str | None = None,
    instruct: str | None = None,
    lexicon: Lexicon | Mapping[str, str] | None = None,
    max_chars: int | None = DEFAULT_MAX_CHARS,
) -> PreparedText:
    """Prepare `text` for synthesis in the mode its inputs select (see `prompts` for the modes).

    `prompt_text` is the transcript of the prompt audio (zero-shot); `instruct` is a preset id/label or a
    free-text instruction (instruct mode; it wins over a transcript). Neither: cross-lingual.
    `lexicon` is a `Lexicon` or a plain word -> pronunciation mapping (compiled here, so checked here).
    Raises InputError for empty or too long text, bad pronunciations, or nothing left to speak.
    """
    warnings: list[str] = []
    inline, body = inline_instruction(text)
    require_visible_text(body)
    body, inline = drop_invisible(body), drop_invisible(inline) if inline else inline
    instruct = drop_invisible(instruct) if instruct else instruct
    prompt_text = drop_invisible(prompt_text) if prompt_text else prompt_text
    if max_chars is not None:
        check_length(body, max_chars)
    check_inline_instruction(inline)

    instruction = resolve_instruction(instruct) if instruct and instruct.strip() else None
    plain_instruct = strip_system_markers(instruct or "")
    if instruction and find_preset(plain_instruct) is None and paraphrased_preset(plain_instruct):
        warnings.append(
            f"the instruction {plain_instruct.strip()!r} is read as the trained wording {instruction!r}"
        )
    tagged, rest = leading_tag_instruction(body)
    if tagged is not None and not rest.strip():  # it said "the text '' has nothing to speak"
        raise TextError(
            f"the text {quoted(body.strip())} is only an instruction tag: give the words to speak after it"
        )
    body = rest
    for found, where in (
        (tagged, "the tag at the start of the text"),
        (inline, "the text before <|endofprompt|>"),
    ):
        if found is None:
            continue
        if instruction is None:
            instruction = found
        elif found != instruction:
            warnings.append(f"{where} ({found!r}) was ignored: the instruction {instruction!r} applies")

    transcript = None
    if prompt_text and prompt_text.strip():
        transcript_instruction, transcript_body = inline_instruction(prompt_text)
        if instruction is None and transcript_instruction is not None:
            instruction = transcript_instruction
        transcript = prepare_plain(transcript_body) or None
        if transcript is None and instruction is None:
            warnings.append(
                "the prompt transcript has nothing to read: cloning without it (cross-lingual mode)"
            )

    if lexicon is not None and not isinstance(lexicon, Lexicon):
        lexicon = Lexicon(lexicon)
    converted = convert_written(body, lexicon)
    lang = text_language(converted)
    spoken = normalize_text(converted, lang)
    segments = split_text(spoken, tokenizer, text_language(spoken))
    if not segments:
        raise TextError(
            f"the text {quoted(body)} has nothing to speak after normalisation: give words to read"
        )

    lm_texts = assemble_lm_texts(segments, prompt_transcript=transcript, instruction=instruction)
    if lm_texts.use_prompt_speech_tokens and transcript is not None:
        warnings.extend(w for segment in segments if (w := short_text_warning(segment, transcript)))
    return PreparedText(
        lm_prompt_text=lm_texts.prompt_text,
        segments=lm_texts.texts,
        display_segments=segments,
        use_prompt_speech_tokens=lm_texts.use_prompt_speech_tokens,
        mode=lm_texts.mode,
        instruction=instruction,
        warnings=warnings,
        lm_prompt_ids=tokenizer.encode(lm_texts.prompt_text) if lm_texts.prompt_text else [],
        segment_ids=[tokenizer.encode(text) for text in lm_texts.texts],
        typed_finder=_typed_finder(body, lexicon, lang),
    )


QUOTED_CHARS = 40  # of a refused text, in its message (and so in the log): it was echoed whole


def quoted(text: str) -> str:
    """`text` quoted for a message, its first QUOTED_CHARS characters only."""
    return repr(text) if len(text) <= QUOTED_CHARS else f"{text[:QUOTED_CHARS]!r}… ({len(text)} characters)"
