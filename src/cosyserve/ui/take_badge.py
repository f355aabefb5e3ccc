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
    numbers = [
        f"similarity {scores.similarity:.2f}" if scores.similarity is not None else "",
        f"pace {scores.pace_ratio:.2f}" if scores.pace_ratio is not None else "",
        f"repetition {scores.repetition:.2f}",
        f"silence {scores.silence_ratio:.2f}",
        f"longest pause {scores.longest_pause_s:.1f} s",
        f"clipping {scores.clipping_ratio:.4f}",
        f"flatness {scores.flatness:.3f}",
        f"error rate {scores.error_rate:.2f}" if scores.error_rate is not None else "",
    ]
    hover = " · ".join(n for n in numbers if n)
    state = "passed" if scores.passed else "failed"
    return (
        f'<span class="cosy-take" data-state="{state}" title="{html.escape(hover, quote=True)}">'
        f"{html.escape(label)}</span>"
    )
