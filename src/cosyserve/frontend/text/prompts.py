"""What the LM reads in each mode, and the instructions it was trained on.

The LM input is `prompt text ++ text`. CosyVoice3 expects a system sentence and `<|endofprompt|>` in it:
- zero-shot clone: prompt text `You are a helpful assistant.<|endofprompt|>` + the prompt's transcript;
  the LM also reads the prompt's speech tokens;
- cross-lingual (no transcript): no prompt text and no prompt speech tokens; each text segment starts
  with `You are a helpful assistant.<|endofprompt|>` instead;
- instruct: prompt text `You are a helpful assistant. ` + instruction + `<|endofprompt|>`; no prompt speech
  tokens in the LM (the flow still clones the prompt's voice).

Users copy the official examples, so a system sentence or `<|endofprompt|>` typed into a transcript,
instruction or text is removed before assembly (nothing is doubled), and text typed before
`<|endofprompt|>` other than the system sentence is taken as an instruction (`inline_instruction`).

A tag at the very start of the text becomes the instruction (`leading_tag_instruction`), unless it is
a special tag (`[breath]`), looks like a phone (`[hǎo]`, `[AY1]`) or is followed by `[`/`(` (a
pronunciation such as `[重庆][chóng qìng]`):
- a known tag (a preset id, label or alias, Chinese or English): the preset's instruction, so
  `[兴奋]请开始你的表演` and `[sad] I lost it` get `请非常兴奋地说一句话。` / `请非常伤心地说一句话。`;
- words that read as an instruction (holding 请, 语气, 语速, 声音, 口音, 风格, please, speak, voice,
  tone, style, accent, …): that free text, e.g. `[用播音员的语气]…`;
- a Chinese adverb ending in 地: `[慢慢地]` -> `请慢慢地说一句话。`;
- one English word: `[cheerful]` -> `Please speak in a cheerful tone.`;
- anything else (`[重庆]是…`, `[注]`) is not an instruction and stays in the text.
Tags elsewhere in the text are never instructions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cosyserve.frontend.text.normalize import contains_chinese
from cosyserve.frontend.text.presets import INSTRUCT_PRESETS, InstructPreset
from cosyserve.frontend.text.pronunciation import looks_like_phone
from cosyserve.frontend.text.tags import MARKER_PATTERN, SPECIAL_TAGS, nfc
from cosyserve.frontend.tokenizer import ENDOFPROMPT

SYSTEM_PROMPT = "You are a helpful assistant."
SYSTEM_PREFIX = SYSTEM_PROMPT + ENDOFPROMPT

_SYSTEM_SENTENCE = re.compile(r"^\s*you are a helpful assistant\s*[.。]?\s*", re.IGNORECASE)
_FINAL_PUNCTUATION = frozenset("。！？.!?…")
_LEADING_TAG = re.compile(r"^\s*\[([^\[\]\n]{1,60})\][ \t]*")
_INSTRUCTION_WORDS = re.compile(
    r"请|语气|语调|语速|声音|音量|口音|风格|方式|情绪|地说|"
    r"\b(please|speak|say|talk|voice|tone|style|accent|emotion)\b",
    re.IGNORECASE,
)
_CHINESE_ADVERB = re.compile(r"[\u4e00-\u9fff]{1,8}地")
_ENGLISH_WORD = re.compile(r"[A-Za-z][A-Za-z-]{0,24}")


def _preset_keys() -> dict[str, InstructPreset]:
    keys: dict[str, InstructPreset] = {}
    for preset in INSTRUCT_PRESETS:
        names = (preset.id, preset.id.split(":", 1)[-1], preset.label_zh, preset.label_en, *preset.aliases)
        for name in names:
            keys.setdefault(name.strip().lower(), preset)
    return keys


_PRESET_KEYS = _preset_keys()


def find_preset(name: str) -> InstructPreset | None:
    """The preset named by an id (`dialect:cantonese`), its short id (`cantonese`), a label or an alias."""
    return _PRESET_KEYS.get(nfc(name).strip().lower())


@dataclass(frozen=True)
class LMTexts:
    """The texts the LM reads in one mode: `prompt_text` once, then each of `texts` in turn."""

    prompt_text: str  # "" in cross-lingual mode
    texts: list[str] = field(default_factory=list)
    use_prompt_speech_tokens: bool = False  # True only for zero-shot cloning

    @property
    def mode(self) -> str:
        """`"zero_shot"`, `"instruct"` or `"cross_lingual"`."""
        if self.use_prompt_speech_tokens:
            return "zero_shot"
        return "instruct" if self.prompt_text else "cross_lingual"


def strip_system_markers(text: str) -> str:
    """`text` without a leading system sentence and without `<|…|>` markers such as `<|endofprompt|>`."""
    text = MARKER_PATTERN.sub("", nfc(text))
    return _SYSTEM_SENTENCE.sub("", text, count=1)


def inline_instruction(text: str) -> tuple[str | None, str]:
    """Split `"<system sentence> <instruction><|endofprompt|><rest>"` into (instruction or None, rest).

    Without `<|endofprompt|>` the instruction is None and rest is `text` with any system sentence and
    markers removed.
    """
    text = nfc(text)
    if ENDOFPROMPT not in text:
        return None, strip_system_markers(text)
    head, rest = text.rsplit(ENDOFPROMPT, 1)
    instruction = strip_system_markers(head).strip()
    return (clean_instruction(instruction) if instruction else None), strip_system_markers(rest)


def clean_instruction(instruction: str) -> str:
    """A free-text instruction as the LM gets it: markers removed, trimmed, ending in punctuation."""
    text = " ".join(strip_system_markers(instruction).split())
    if text and text[-1] not in _FINAL_PUNCTUATION:
        text += "。" if contains_chinese(text) else "."
    return text


def resolve_instruction(instruction: str | None) -> str | None:
    """The instruction text for a preset id/label/alias, a close paraphrase of a preset (`请用四川话说`
    -> `请用四川话表达。`: the model was trained on the preset's wording), or a free-text instruction;
    None when empty."""
    if instruction is None:
        return None
    plain = strip_system_markers(instruction)
    preset = find_preset(plain) or paraphrased_preset(plain)
    if preset is not None:
        return preset.instruction
    text = clean_instruction(instruction)
    return text or None


# Words around a preset's name that do not change what it asks for ("请用…说", "speak in … please").
_FILLER = re.compile(
    r"一句话|表达|语气|语调|语速|声音|口音|方言|非常|尽可能|一点|一些|朗读|读出来|来说|说话|请|用|说|讲|读|地|的|以|"
    r"\b(?:please|speak|say|talk|read|it|this|in|an?|the|with|voice|tone|accent|dialect|very|way|style)\b|"
    r"[\s,，。.!！?？、~～]+",
    re.IGNORECASE,
)


def paraphrased_preset(instruction: str) -> InstructPreset | None:
    """The preset a free-text instruction only rephrases: its name with filler words around it."""
    core = _FILLER.sub("", nfc(instruction)).strip().lower()
    if not core or len(core) > 24:
        return None
    return find_preset(core)


def leading_tag_instruction(text: str) -> tuple[str | None, str]:
    """(instruction, rest of the text) for a text that starts with an instruction tag; see the module doc."""
    match = _LEADING_TAG.match(text)
    if match is None:
        return None, text
    word = match.group(1).strip()
    rest = text[match.end() :]
    if (
        not word
        or f"[{word}]" in SPECIAL_TAGS
        or looks_like_phone(word)
        or rest[:1] in ("[", "(", "（")
        or not any(char.isalpha() for char in word)
    ):
        return None, text
    instruction = tag_to_instruction(word)
    if instruction is None:
        return None, text
    return instruction, rest.lstrip()


def tag_to_instruction(word: str) -> str | None:
    """The instruction a leading tag's word stands for, or None when it is not one (see the module doc)."""
    preset = find_preset(word)
    if preset is not None:
        return preset.instruction
    if _INSTRUCTION_WORDS.search(word):
        return clean_instruction(word)
    if _CHINESE_ADVERB.fullmatch(word):
        return f"请{word}说一句话。"
    if _ENGLISH_WORD.fullmatch(word):
        return f"Please speak in a {word.lower()} tone."
    return None


def assemble_lm_texts(
    segments: list[str], *, prompt_transcript: str | None = None, instruction: str | None = None
) -> LMTexts:
    """Put the system sentence and `<|endofprompt|>` where each mode wants them.

    `instruction` (already resolved) selects instruct mode; else a non-empty `prompt_transcript` (already
    normalised) selects zero-shot; else cross-lingual. Inputs must be free of system markers.
    """
    if instruction:
        return LMTexts(f"{SYSTEM_PROMPT} {instruction}{ENDOFPROMPT}", list(segments), False)
    if prompt_transcript:
        return LMTexts(SYSTEM_PREFIX + prompt_transcript, list(segments), True)
    return LMTexts("", [SYSTEM_PREFIX + segment for segment in segments], False)
