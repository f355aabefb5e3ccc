"""Chinese reading rules: where wetext's Chinese grammar (with the official cleanups) reads wrong.

Each rule fires only where the official reading is wrong (measured with wetext 0.1.8; the table in
tests/test_readings.py holds the cases): money keeps its trailing zeros (`¥12.50` -> 十二点五零元), a
negative percentage puts 负 inside (百分之负三), `第3-5章` subtracts (第三减五章), `3–5天` / `3～5天` and
`10%-20%` keep the dash, `比分3-2` subtracts, `+86 138…` is read as a sum of big numbers, `2.3.1` and web
addresses are cut into sentences at their dots, and a 2 is read 两 or 二 by its measure word alone
(`第2课` 第两课, `2倍` 二倍; `readings_zh_two` reads it by meaning). Most of them are rewritten into a form
wetext reads right, so its wording (元, 到, 负百分之…) stays the official's.
"""

from __future__ import annotations

import re

from cosyserve.frontend.text.corrections import Reading, Rule, rewrite
from cosyserve.frontend.text.numbers_zh import cardinal_zh
from cosyserve.frontend.text.official import wetext
from cosyserve.frontend.text.readings_en import looks_like_ip_or_date
from cosyserve.frontend.text.readings_zh_codes import RULES as CODE_RULES
from cosyserve.frontend.text.readings_zh_two import RULES as TWO_RULES
from cosyserve.frontend.text.web_readings import ZH_RULES as WEB_RULES

# Phone digits as said on the phone: 1 is 幺 (not to be heard as 七).
PHONE_DIGITS = "零幺二三四五六七八九"
_CURRENCY_WORDS = "元|块|美元|欧元|英镑|日元|港币|港元|人民币"
_DECIMAL = r"\d+(?:\.\d+)?"


def _read_money_zeros(match: re.Match[str]) -> Reading | None:
    """`¥12.50` -> `¥12.5`, `12.00元` -> `12元`: wetext reads the zeros out (十二点五零元)."""
    if not match["pre"] and not match["post"]:
        return None
    fraction = match["frac"].rstrip("0")
    amount = match["int"] + (f".{fraction}" if fraction else "")
    return Reading(f"{match['pre'] or ''}{amount}{match['post'] or ''}", spoken=False)


def _read_phone_plus(match: re.Match[str]) -> Reading | None:
    groups = re.findall(r"\d+", match.group())
    if sum(len(g) for g in groups) < 7:
        return None
    spoken = "，".join("".join(PHONE_DIGITS[int(d)] for d in group) for group in groups)
    return Reading("加" + spoken, spoken=True)


def _read_large_count(match: re.Match[str]) -> Reading | None:
    """A count of 13 to 16 digits (`1000000000000元`): wetext reads it wrong (一千亿零元, 十零零零…)."""
    digits = match["number"].replace(",", "")
    said = cardinal_zh(int(digits))
    if said[:1] == "二" and said[1:2] in ("千", "万", "亿"):
        said = "两" + said[1:]  # 两万亿, as wetext says 两千, 两万, 两亿
    said = _SIGNS.get(match["sign"] or "", "") + said + ("到" if match["upto"] else "")
    if wetext(match.group() + (match["after"] or ""), "zh").startswith(said):
        return None
    return Reading(said, spoken=True)


_SIGNS = {"-": "负", "−": "负", "+": "正"}  # a sign before a number (not between two: that is a range)


def _read_version(match: re.Match[str]) -> Reading | None:
    """`2.3.1` -> 二点三点一 (each part as a number); IP addresses and dotted dates are left to wetext."""
    parts = match.group().split(".")
    if looks_like_ip_or_date(parts):
        return None
    return Reading("点".join(wetext(part, "zh") for part in parts), spoken=True)


RULES: tuple[Rule, ...] = (
    Rule("minus sign", re.compile(r"\u2212(?=\d)"), rewrite("-")),
    *WEB_RULES,
    Rule(
        "international phone number",
        re.compile(r"(?<![A-Za-z0-9_+])\+\d{1,3}(?:[\s.-]?\(?\d{1,4}\)?){2,5}(?!\d)"),
        _read_phone_plus,
    ),
    Rule("version number", re.compile(r"(?<![\d.])\d+(?:\.\d+){2,}(?![\d.]|\.\d)"), _read_version),
    *CODE_RULES,
    Rule("division sign", re.compile(r"(?<=\d)\s*÷\s*(?=\d)"), rewrite("除以")),  # 三除四 is 4 / 3
    Rule("score", re.compile(r"(比分(?:是|为)?)\s*(\d+)\s*[-–—:：]\s*(\d+)"), rewrite(r"\1\2:\3")),
    Rule("ordinal range", re.compile(r"第(\d+)\s*[-–—~～]\s*(\d+)"), rewrite(r"第\1到\2")),
    Rule(
        "percentage range",
        re.compile(rf"(?<![\d.])({_DECIMAL})%\s*[-–—~～]\s*({_DECIMAL})%"),
        rewrite(r"\1%到\2%"),
    ),
    Rule(
        "range with a dash",
        re.compile(rf"(?<![\d.])({_DECIMAL})(%?)\s*[–—～]\s*({_DECIMAL})(%?)(?![\d.])"),
        rewrite(r"\1\2到\3\4"),
    ),
    Rule("negative percentage", re.compile(rf"(?<![\d.%])-({_DECIMAL})%"), rewrite(r"负\1%")),
    Rule(
        "money with trailing zeros",
        re.compile(
            rf"(?P<pre>[¥￥$€£]\s?)?(?P<int>\d+(?:,\d{{3}})*)\.(?P<frac>\d*?0)(?![\d.])"
            rf"(?P<post>\s?(?:{_CURRENCY_WORDS}))?"
        ),
        _read_money_zeros,
    ),
    Rule(
        "count of 13 to 16 digits",
        re.compile(
            r"(?:(?<![0-9A-Za-z.,])(?P<sign>[-−+]))?(?<![\d.,])(?P<number>\d{13,16}|\d{1,3}(?:,\d{3}){4,5})(?![\d.,])"
            r"(?:(?P<upto>\s*[-–—~～]\s*)(?=\d)|(?=(?P<after>[\u4e00-\u9fff])))"
        ),
        _read_large_count,
    ),
    *TWO_RULES,
)
