"""Chinese readings of the digit 2: 两 when it counts, 二 when it names a place in an order.

wetext reads a 2 before a measure word as 两 from a fixed list of measure words, and as 二 before every
other word. A Chinese reader decides by meaning instead, and wetext is wrong both ways:
- an ordinal is never 两: `第2课` is 第二课 (wetext: 第两课), `第200名` 第二百名, and the day of a date
  is 二: `2月2日` is 二月二日 (wetext: 二月两日);
- a count is 两: `2倍` 两倍, `2次` 两次, `近2年` 两年, `2台` 两台 (wetext: 二), and the hour of a clock time
  is 两: `下午2点` 两点, `2点半` 两点半 (wetext reads `2:30` right, 两点三十分, but `2点` as 二点);
  a range of counts is a range: `1-2次` 一到两次, `2-3遍` 两到三遍 (wetext: 一减二次, 二减三遍).
Names that happen to hold a 2 stay 二 as wetext reads them (`2号`, `2楼`, `2班`, `2路`, `2月`, `2两`),
and so do 12, 20, 22 and decimals. Each rule fires only where wetext reads the match differently from
the rule (it checks wetext on the match with the words after it), so corrections are reported only where
the official reading is wrong. The readings are final words: the 2 and what precedes it are read apart.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from cosyserve.frontend.text.corrections import Reading, Rule
from cosyserve.frontend.text.numbers_zh import cardinal_zh
from cosyserve.frontend.text.official import wetext

# What may not come right before a counted 2: a digit or a decimal point (12, 0.2), a letter or code
# (x2, A2), or a sign that binds it to the number before it (1-2, 3/2, 1~2, 10:2).
_NOT_AFTER = r"(?<![A-Za-z0-9.,:_/+×*^%\-–—~～第])"
# Measure words a Chinese reader counts with 两 where wetext says 二 (measured with wetext 0.1.8). Words
# that also name a thing by its number (班 class, 组 group, 期 phase, 号, 栋, 排, 路) are left out.
_COUNTED = (
    "倍|次(?![方元])|遍|番|下(?![午面方])|台|份|朵|间|所|门|部|句|项|种|类|批|届|顿|声|步|圈|眼|晚"
    "|公斤|亩|英里|码|扇|串|笔|桌|局|轮|成|角|毛|章|节|行|列"
)
# 年 counts years (两年) except in 年级 (二年级, a grade) and after 公元 (the year 2 AD, see the rule).
_YEARS = r"年(?![级代])"
# The hour of a clock time: 2点 followed by a word, 半/整/钟, or minutes (2点30, 2点5分); `2点5` is left.
_HOUR = r"点(?=\d{2}(?!\d)|\d分|[^\d]|$)"
# A 2 that opens a range of counts (`2到3遍`, after the range rule) is counted too: 两到三遍.
_UPTO = r"(?:[到至]\d+)?"


def _followed_by(measure: str) -> str:
    """A lookahead for `measure`, capturing it with the few words after it as `after`."""
    return rf"(?=(?P<after>(?:{measure})[^\d\s]{{0,4}}))"


def _official_differs(written: str, spoken: str, after: str) -> bool:
    """Does wetext read `written` (followed by `after`, as in the text) as anything else than `spoken`?"""
    return not wetext(written + after, "zh").startswith(spoken)


def _read_count_range(match: re.Match[str]) -> Reading | None:
    """`1-2次` -> `1到2次` for wetext (it subtracts: 一减二次), and `1~2次` where a 2 then counts (两)."""
    if match["sep"] != "-" and "2" not in (match["low"], match["high"]):
        return None  # `3~5次` wetext reads right (三到五次)
    return Reading(f"{match['low']}到{match['high']}", spoken=False)


def _read_ordinal(match: re.Match[str]) -> Reading | None:
    """`第2课` -> 第二课, `第200名` -> 第二百名, `第2到3课` -> 第二到三课: an ordinal never counts with 两
    (and `第12345名` is 第一万二千三百四十五名: wetext reads an ordinal of five digits digit by digit)."""
    reading = re.sub(
        r"\d+", lambda number: cardinal_zh(int(number.group())), re.sub(r"\s+", "", match["ordinal"])
    )
    if not _official_differs(match["ordinal"], reading, match["after"]):
        return None
    return Reading(reading, spoken=True)


def _read_two(spoken: str) -> Callable[[re.Match[str]], Reading | None]:
    """A rule reader that says the matched 2 as `spoken` where wetext says it otherwise."""

    def read(match: re.Match[str]) -> Reading | None:
        if not _official_differs(match["two"], spoken, match["after"]):
            return None
        return Reading(spoken, spoken=True)

    return read


RULES: tuple[Rule, ...] = (
    Rule(
        "ordinal read with 二",
        re.compile(rf"(?P<ordinal>第\s*\d+(?:\s*到\s*\d+)?)(?![\d.]){_followed_by('')}"),
        _read_ordinal,
    ),
    Rule(
        "day of the month read with 二",
        re.compile(rf"(?<=月)(?P<two>0?2){_followed_by('日')}"),
        _read_two("二"),
    ),
    Rule(
        "2点 (an hour, or two points) read with 两",
        re.compile(rf"{_NOT_AFTER}(?P<two>2){_followed_by(_HOUR)}"),
        _read_two("两"),
    ),
    Rule(
        "range of counts",
        re.compile(
            rf"(?<![\d.])(?P<low>\d+)\s*(?P<sep>[-~～])\s*(?P<high>\d+)(?=\s*(?:{_COUNTED}|{_YEARS}))"
        ),
        _read_count_range,
    ),
    Rule(
        "count read with 两",
        re.compile(rf"{_NOT_AFTER}(?P<two>2){_followed_by(_UPTO + f'(?:{_COUNTED})')}"),
        _read_two("两"),
    ),
    Rule(
        "years counted with 两",
        re.compile(rf"(?<!公元)(?<!公元前){_NOT_AFTER}(?P<two>2){_followed_by(_UPTO + _YEARS)}"),
        _read_two("两"),
    ),
)
