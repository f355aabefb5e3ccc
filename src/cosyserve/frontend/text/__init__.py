"""The text frontend: from what a user typed to the texts the LM reads (pure functions, no model math).

`prepare_texts` runs everything and `describe_text` shows what it made of a text; the modules can be used
on their own: `prompts` (modes, instructions), `presets` (trained instructions), `normalize` (the official
normalisation from `official`, corrected by the rules in `readings_en`, `readings_zh`, `web_readings` and
`punctuation`), `split` (segments), `pronunciation` (pinyin / CMU to native tokens), `japanese` (katakana),
`lexicon` (user pronunciation dictionary), `tags` (special tags kept intact).
"""

from cosyserve.frontend.text.describe import TextDescription, describe_text
from cosyserve.frontend.text.japanese import to_katakana
from cosyserve.frontend.text.lexicon import Lexicon
from cosyserve.frontend.text.normalize import normalize_text, text_language
from cosyserve.frontend.text.prepare import (
    DEFAULT_MAX_CHARS,
    PreparedText,
    check_length,
    prepare_plain,
    prepare_texts,
)
from cosyserve.frontend.text.presets import INSTRUCT_PRESETS, InstructPreset
from cosyserve.frontend.text.prompts import (
    ENDOFPROMPT,
    SYSTEM_PREFIX,
    SYSTEM_PROMPT,
    LMTexts,
    assemble_lm_texts,
    find_preset,
    inline_instruction,
    leading_tag_instruction,
    resolve_instruction,
    strip_system_markers,
)
from cosyserve.frontend.text.pronunciation import convert_pronunciations, spec_to_tokens
from cosyserve.frontend.text.split import short_text_warning, split_text

__all__ = [
    "DEFAULT_MAX_CHARS",
    "ENDOFPROMPT",
    "INSTRUCT_PRESETS",
    "SYSTEM_PREFIX",
    "SYSTEM_PROMPT",
    "InstructPreset",
    "LMTexts",
    "Lexicon",
    "PreparedText",
    "TextDescription",
    "assemble_lm_texts",
    "check_length",
    "convert_pronunciations",
    "describe_text",
    "find_preset",
    "inline_instruction",
    "leading_tag_instruction",
    "normalize_text",
    "prepare_plain",
    "prepare_texts",
    "resolve_instruction",
    "short_text_warning",
    "spec_to_tokens",
    "split_text",
    "strip_system_markers",
    "text_language",
    "to_katakana",
]
