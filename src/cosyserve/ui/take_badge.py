"""The kept take's checks as a badge beside the result's info: ✓ or ⚠ with the number of takes, every
score in its hover text (`service.quality`)."""

from __future__ import annotations

import html
from collections.abc import Iterable

from cosyserve.ui.bridge import TakeReport

_WORDS = {
    "passed": ("检查通过", "checks passed"),
    "failed": ("请试听：{failed}", "listen to it: {failed}"),
    "takes": ("{n} 次生成", "{n} takes"),
}


# the checks' names (`service.quality.scores.CHECKS`) as the page says them
_CHECKS = {
    "similarity": "音色相似度",
    "duration": "时长",
    "repetition": "重复",
    "silence": "静音",
    "pause": "停顿",
    "clipping": "削波",
    "noise": "噪声",
    "intelligibility": "可懂度",
}


# the scores in the badge's hover text, on the Chinese page
_HOVER_ZH = {
    "similarity": "音色相似度",
    "pace": "语速比",
    "repetition": "重复度",
    "silence": "静音占比",
    "longest pause": "最长停顿",
    "clipping": "削波占比",
    "flatness": "频谱平坦度",
    "error rate": "识别错误率",
}


def check_names(failed: Iterable[str] | None, lang: str) -> str:
    """The failed checks, named in `lang` and joined ("duration, noise"; "时长、噪声")."""
    names = [str(name) for name in (failed or ())]
    if lang == "zh":
        return "、".join(_CHECKS.get(name, name) for name in names)
    return ", ".join(names)


def _say(key: str, lang: str, **values: object) -> str:
    zh, en = _WORDS[key]
    return (zh if lang == "zh" else en).format(**values)


def take_badge(report: TakeReport | None, lang: str) -> str:
    """Inline HTML (empty when the take was not scored)."""
    if report is None:
        return ""
    scores = report.scores
    if scores.passed:
        label = "✓ " + _say("passed", lang)
    else:
        label = "⚠ " + _say("failed", lang, failed=check_names(scores.failed, lang))
    if report.takes > 1:
        label += " · " + _say("takes", lang, n=report.takes)
    scored = [
        ("similarity", scores.similarity, "{:.2f}"),
        ("pace", scores.pace_ratio, "{:.2f}"),
        ("repetition", scores.repetition, "{:.2f}"),
        ("silence", scores.silence_ratio, "{:.2f}"),
        ("longest pause", scores.longest_pause_s, "{:.1f} s"),
        ("clipping", scores.clipping_ratio, "{:.4f}"),
        ("flatness", scores.flatness, "{:.3f}"),
        ("error rate", scores.error_rate, "{:.2f}"),
    ]
    said = _HOVER_ZH if lang == "zh" else {}
    hover = " · ".join(
        f"{said.get(name, name)} {shape.format(value)}" for name, value, shape in scored if value is not None
    )
    state = "passed" if scores.passed else "failed"
    return (
        f'<span class="cosy-take" data-state="{state}" title="{html.escape(hover, quote=True)}">'
        f"{html.escape(label)}</span>"
    )
