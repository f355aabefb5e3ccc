"""The service's warnings in the page's language.

The service words its warnings in English for every surface (API responses, manifests, logs): the text
checks (`frontend.text.prepare`, `frontend.text.split`) and the recording checks
(`frontend.prompt_check`). The Chinese page says them in Chinese: each known warning is matched by a
pattern here and reworded with the values it carries; one this module does not know stays as it came
(`tests/test_ui_i18n_warnings.py` makes every warning the checks can give match one).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_ANY = r"(?P<{}>.+?)"


def _pattern(english: str, *names: str) -> re.Pattern[str]:
    """`english` with each `{}` a named group (in `names`' order), everything else taken literally."""
    pieces = english.split("{}")
    if len(pieces) != len(names) + 1:
        raise ValueError(f"{english!r} has {len(pieces) - 1} slots for {len(names)} names")
    regex = re.escape(pieces[0])
    for name, piece in zip(names, pieces[1:], strict=True):
        regex += _ANY.format(name) + re.escape(piece)
    return re.compile(regex, re.DOTALL)


_NOISY = "noisy recording (speech about {} dB above the background): the noise is cloned with the voice"
_ZH_NOISY = "录音有噪声（语音只比背景高约 {snr} dB）：噪声会随声音一起被克隆"

# (pattern, Chinese wording); the first that matches the whole warning is used
_ZH: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        _pattern("the instruction {} is read as the trained wording {}", "given", "trained"),
        "指令 {given} 按训练时的说法 {trained} 理解",
    ),
    (
        _pattern(
            "the tag at the start of the text ({}) was ignored: the instruction {} applies", "found", "used"
        ),
        "文本开头的标签（{found}）未被采用：以指令 {used} 为准",
    ),
    (
        _pattern(
            "the text before <|endofprompt|> ({}) was ignored: the instruction {} applies", "found", "used"
        ),
        "<|endofprompt|> 之前的文本（{found}）未被采用：以指令 {used} 为准",
    ),
    (
        _pattern("the prompt transcript has nothing to read: cloning without it (cross-lingual mode)"),
        "参考音频的文本里没有可读的内容：不用它来克隆（跨语种模式）",
    ),
    (
        _pattern(
            "the text {} is less than half as long as the voice's transcript: speech for a text much shorter "
            "than its prompt often comes out wrong; use a longer text or a shorter prompt",
            "segment",
        ),
        "文本 {segment} 不到音色参考文本长度的一半：比参考音频短得多的文本常常读错；"
        "请用更长的文本或更短的参考音频",
    ),
    (
        _pattern(
            "low sample rate ({} Hz): the cloned voice will sound muffled; use 16 kHz or more if you can",
            "rate",
        ),
        "采样率偏低（{rate} Hz）：克隆出的声音会发闷；尽量使用 16 kHz 或更高的采样率",
    ),
    (
        _pattern(
            "very quiet recording (speech at {} dBFS): it is amplified, and its background noise with it; "
            "record closer to the microphone",
            "level",
        ),
        "录音音量很低（语音约 {level} dBFS）：它会被放大，背景噪声也随之放大；请靠近麦克风录音",
    ),
    (
        _pattern(
            "some clipping ({} of samples at full scale): the cloned voice may sound harsh; "
            "record with the input gain lower",
            "share",
        ),
        "有削波（{share} 的采样达到满幅）：克隆出的声音可能刺耳；请调低输入增益后再录",
    ),
    (
        _pattern(
            "no trailing silence: the model may speak the end of the prompt; leave about half a second of "
            "silence after the last word"
        ),
        "结尾没有静音：模型可能会把参考音频的结尾也念出来；请在最后一个字后留约半秒静音",
    ),
    (
        _pattern(_NOISY + "; turn on noise reduction or record somewhere quieter", "snr"),
        _ZH_NOISY + "；请打开降噪，或在更安静的地方录音",
    ),
    (
        _pattern(
            _NOISY + "; record somewhere quieter (noise reduction is not installed on this server: {})",
            "snr",
            "command",
        ),
        _ZH_NOISY + "；请在更安静的地方录音（本服务器未安装降噪：{command}）",
    ),
)


def say_warning(warning: str, lang: str) -> str:
    """`warning` (as the service worded it) in `lang`."""
    if lang != "zh":
        return warning
    for pattern, zh in _ZH:
        found = pattern.fullmatch(warning)
        if found:
            return zh.format(**found.groupdict())
    return warning


def say_warnings(warnings: Iterable[str] | None, lang: str) -> list[str]:
    return [say_warning(str(warning), lang) for warning in (warnings or ())]
