"""Instruction presets: the instructions CosyVoice3 was trained on, plus a few emotions in the same wording.

`trained` presets use the exact sentences of the official instruction list (17 dialects, loud/soft,
fast/slow, happy/sad/angry, two role styles). The other emotions follow the trained emotion sentence
(`请非常…地说一句话。`); the model follows them less reliably.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InstructPreset:
    """One selectable instruction; `instruction` is what goes between the system sentence and the marker."""

    id: str  # "dialect:cantonese", "speed:fast", ...
    label_zh: str
    label_en: str
    instruction: str
    trained: bool = True  # the exact wording was in the model's training instructions
    aliases: tuple[str, ...] = ()  # more names a leading text tag may use, e.g. "[高兴]"


_DIALECTS = (
    ("cantonese", "广东话", "Cantonese", ("粤语",)),
    ("northeastern", "东北话", "Northeastern Mandarin", ()),
    ("gansu", "甘肃话", "Gansu dialect", ()),
    ("guizhou", "贵州话", "Guizhou dialect", ()),
    ("henan", "河南话", "Henan dialect", ()),
    ("hubei", "湖北话", "Hubei dialect", ()),
    ("hunan", "湖南话", "Hunan dialect", ()),
    ("jiangxi", "江西话", "Jiangxi dialect", ()),
    ("minnan", "闽南话", "Minnan (Hokkien)", ("hokkien", "闽南语")),
    ("ningxia", "宁夏话", "Ningxia dialect", ()),
    ("shanxi", "山西话", "Shanxi dialect", ()),
    ("shaanxi", "陕西话", "Shaanxi dialect", ()),
    ("shandong", "山东话", "Shandong dialect", ()),
    ("shanghainese", "上海话", "Shanghainese", ()),
    ("sichuanese", "四川话", "Sichuanese", ()),
    ("tianjin", "天津话", "Tianjin dialect", ()),
    ("yunnan", "云南话", "Yunnan dialect", ()),
)

# Emotions outside the trained list, written like the trained ones.
_MORE_EMOTIONS = (
    ("excited", "兴奋", "Excited", ("激动",)),
    ("surprised", "惊讶", "Surprised", ("吃惊", "surprise")),
    ("fearful", "害怕", "Fearful", ("恐惧", "scared", "afraid", "fear")),
    ("gentle", "温柔", "Gentle", ("tender",)),
    ("calm", "平静", "Calm", ()),
    ("serious", "严肃", "Serious", ()),
    ("disgusted", "厌恶", "Disgusted", ("disgust",)),
    ("worried", "担心", "Worried", ("担忧",)),
)

INSTRUCT_PRESETS: tuple[InstructPreset, ...] = (
    *(
        InstructPreset(f"dialect:{key}", zh, en, f"请用{zh}表达。", aliases=aliases)
        for key, zh, en, aliases in _DIALECTS
    ),
    InstructPreset(
        "volume:loud",
        "大声",
        "Loud",
        "Please say a sentence as loudly as possible.",
        aliases=("loudly", "shout", "shouting", "喊", "大喊"),
    ),
    InstructPreset(
        "volume:soft",
        "小声",
        "Soft",
        "Please say a sentence in a very soft voice.",
        aliases=("softly", "quiet", "whisper", "whispering", "轻声", "耳语", "悄悄话"),
    ),
    InstructPreset(
        "speed:fast", "快速", "Fast", "请用尽可能快地语速说一句话。", aliases=("快", "quick", "quickly")
    ),
    InstructPreset("speed:slow", "慢速", "Slow", "请用尽可能慢地语速说一句话。", aliases=("慢", "slowly")),
    InstructPreset(
        "emotion:happy",
        "开心",
        "Happy",
        "请非常开心地说一句话。",
        aliases=("高兴", "快乐", "joyful", "happily"),
    ),
    InstructPreset("emotion:sad", "伤心", "Sad", "请非常伤心地说一句话。", aliases=("难过", "悲伤", "sadly")),
    InstructPreset(
        "emotion:angry", "生气", "Angry", "请非常生气地说一句话。", aliases=("愤怒", "angrily", "mad")
    ),
    *(
        InstructPreset(f"emotion:{key}", zh, en, f"请非常{zh}地说一句话。", trained=False, aliases=aliases)
        for key, zh, en, aliases in _MORE_EMOTIONS
    ),
    InstructPreset("role:peppa_pig", "小猪佩奇", "Peppa Pig", "我想体验一下小猪佩奇风格，可以吗？"),
    InstructPreset("role:robot", "机器人", "Robot", "你可以尝试用机器人的方式解答吗？"),
)
