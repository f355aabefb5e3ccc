"""What the synthesis tabs teach: the markup help, the example texts and the instruction presets' labels."""

from __future__ import annotations

from cosyserve.ui.bridge import INSTRUCT_PRESETS
from cosyserve.ui.i18n import text

HELP = {
    "zh": """
| 写法 | 作用 |
| --- | --- |
| `[h][ào]` | 用拼音（带声调）替换一个字：`爱[h][ào]` 读作「爱好（hào）」 |
| `[重庆][chóng qìng]` | 整词指定读音（自动转换为拼音标记） |
| `[M][AY0][N][UW1][T]` | 英文单词用 CMU 音素指定读音 |
| `[breath]` `[laughter]` `[cough]` `[sigh]` | 在该处插入呼吸、笑声、咳嗽、叹气 |
| `<strong>重点</strong>` | 强调一段文字 |

日语会自动转换为片假名；长文本按句切分，逐句生成。""",
    "en": """
| Write | Effect |
| --- | --- |
| `[h][ào]` | replace one character by its pinyin (with tone): `爱[h][ào]` reads 爱好 as ài hào |
| `[重庆][chóng qìng]` | give a whole word's pronunciation (converted to pinyin marks) |
| `[M][AY0][N][UW1][T]` | an English word's pronunciation as CMU phonemes |
| `[breath]` `[laughter]` `[cough]` `[sigh]` | a breath, laughter, cough or sigh at that point |
| `<strong>word</strong>` | stress a passage |

Japanese is converted to katakana; long texts are split into sentences and spoken one by one.""",
}

EXAMPLES = {
    "zero_shot": [
        "你好，欢迎使用语音合成工作室。",
        "收到好友从远方寄来的生日礼物，那份意外的惊喜让我心中充满了快乐[laughter]。",
        "周末我们一起去[重庆][chóng qìng]吃火锅吧。",
        "Hello! [breath] This voice was cloned from a three second recording.",
    ],
    "cross_lingual": [
        "Hello, nice to meet you. I learned English from a Chinese recording.",
        "こんにちは、今日はいい天気ですね。",
        "Let me read the word [M][AY0][N][UW1][T] for you.",
    ],
    "instruct": [
        "今天天气真不错，我们出去走走吧。",
        "我真的没想到你会来，太让人惊喜了！",
        "The meeting starts at nine, please don't be late.",
    ],
}

GROUP_KEYS = {
    "dialect": "group_dialect",
    "emotion": "group_emotion",
    "speed": "group_speed",
    "volume": "group_volume",
    "role": "group_role",
}


def preset_choices(lang: str) -> list[tuple[str, str]]:
    """(label, preset id) pairs, grouped by kind, with a "no preset" entry first."""
    choices = [(text("preset_none", lang), "")]
    for preset in INSTRUCT_PRESETS:
        group = text(GROUP_KEYS.get(preset.id.split(":")[0], "preset"), lang)
        label = preset.label_zh if lang == "zh" else preset.label_en
        choices.append((f"{group} · {label}", preset.id))
    return choices
