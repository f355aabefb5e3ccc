"""Chinese readings of names with numbers, powers and roots, where wetext reads them wrong.

- A hyphen between a name and its number is no minus: `GPT-4` is GPT四, `COVID-19` COVID十九, `B-52`
  B五十二, `歼-20` 歼二十 (wetext: GPT负四, B负五十二, 歼负二十); a letter standing alone before it is
  a variable, and subtracts: `x-1` x减一 (wetext: x负一).
- A name ending in a currency's letters stays a name: `SARS-2` is SARS二 (wetext: S负二阿根廷比索, the
  ARS of SARS read as Argentine pesos).
- A model number of three or more digits joined to its letters is read digit by digit, as it is said:
  `RTX4090` RTX四零九零, `A320` A三二零 (wetext: 四千零九十, 三百二十).
- Powers and roots are said: `x^2` x的平方, `2^10` 二的十次方, `x²` x的平方, `√2` 根号二 (wetext: x^二,
  二^十, x², √二). Units keep wetext's reading (`m²` 平方米).
Each rule fires only where wetext reads the match differently.
"""

from __future__ import annotations

import re

from cosyserve.frontend.text.corrections import Reading, Rule
from cosyserve.frontend.text.official import wetext

_DIGITS = "零一二三四五六七八九"
# Chinese names of aircraft, missiles and rockets written with a hyphen before their number (歼-20); only
# where no Chinese character comes before them (`一直-5度` is a temperature)
_CJK_DESIGNATIONS = "歼|运|轰|直|东风|长征|红旗|鹰击|巨浪"


def _number_words(number: str, *, joined: bool) -> str:
    """`number` as said after a name: digit by digit when three or more digits are joined to it."""
    if joined and number.isdigit() and len(number) >= 3:
        return "".join(_DIGITS[int(d)] for d in number)
    return wetext(number, "zh")


def _read_name_number(match: re.Match[str]) -> Reading | None:
    """`GPT-4`, `SARS-2`, `RTX4090`, `x-1`, `歼-20` (see the module's list)."""
    name, dash, number = match["name"], match["dash"], match["number"]
    if dash and len(name) == 1 and name.islower():  # a variable: x-1 subtracts
        said = f"{name}减{wetext(number, 'zh')}"
    else:
        said = name + _number_words(number, joined=not dash)
    if wetext(match.group(), "zh") == said:
        return None
    return Reading(said, spoken=True)


def _read_power(match: re.Match[str]) -> Reading:
    exponent = match["exp"]
    said = {"2": "的平方", "3": "的立方"}.get(exponent, f"的{exponent}次方")
    return Reading(match["base"] + said, spoken=False)


RULES: tuple[Rule, ...] = (
    Rule(
        "name with a number",
        re.compile(
            r"(?<![A-Za-z0-9_.\-])(?P<name>[A-Za-z]+)(?P<dash>-?)(?P<number>\d+(?:\.\d+)?)(?![\d.,%])"
        ),
        _read_name_number,
    ),
    Rule(
        "name with a number",
        re.compile(
            rf"(?<![\u4e00-\u9fff])(?P<name>{_CJK_DESIGNATIONS})(?P<dash>-)(?P<number>\d+)(?![\d.,%])"
        ),
        _read_name_number,
    ),
    Rule(
        "power",
        re.compile(r"(?P<base>(?<![A-Za-z0-9])[A-Za-z]|\d+(?:\.\d+)?|\))\s*\^\s*(?P<exp>\d+|[A-Za-z])"),
        _read_power,
    ),
    Rule(  # not after m or s: m², s² are units, which wetext reads (平方米)
        "square or cube of a variable",
        re.compile(r"(?P<base>(?<![A-Za-z])[a-ln-rt-zA-Z]|\))(?P<exp>[²³])"),
        lambda m: Reading(m["base"] + ("的平方" if m["exp"] == "²" else "的立方"), spoken=False),
    ),
    Rule("square root", re.compile(r"√\s*(?=[\d(A-Za-z])"), lambda m: Reading("根号", spoken=False)),
)
