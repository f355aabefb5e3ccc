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

from cosyserve.frontend.text.corrections import Reading, Rule, rewrite
from cosyserve.frontend.text.official import wetext

_DIGITS = "零一二三四五六七八九"
# Chinese names of aircraft, missiles and rockets written with a hyphen before their number (歼-20); only
# where no Chinese character comes before them (`一直-5度` is a temperature)
_CJK_DESIGNATIONS = "歼|运|轰|直|东风|长征|红旗|鹰击|巨浪"
_CURRENCIES = frozenset({"RMB", "USD", "CNY", "EUR", "GBP", "JPY", "HKD", "TWD", "KRW", "AUD", "CAD", "CHF"})
# capitals a number after them counts rather than names (IQ140 is 一百四十)
_COUNTED_AFTER = frozenset({"IQ", "EQ", "HP", "MP", "LV", "NO", "TOP", "VIP", "KPI", "GDP", "CPI"})


def _number_words(name: str, number: str, *, joined: bool) -> str:
    """`number` as said after `name`: digit by digit when three or more digits are joined to a model's
    capital letters (RTX4090, A320), as a count otherwise (Top100, IQ140, x100)."""
    model = name.isupper() and len(name) <= 4 and name not in _COUNTED_AFTER
    if joined and model and number.isdigit() and len(number) >= 3:
        return "".join(_DIGITS[int(d)] for d in number)
    return wetext(number, "zh")


def _read_name_number(match: re.Match[str]) -> Reading | None:
    """`GPT-4`, `SARS-2`, `RTX4090`, `x-1`, `歼-20` (see the module's list)."""
    name, dash, number = match["name"], match["dash"], match["number"]
    official = wetext(match.group(), "zh")
    if name.upper() in _CURRENCIES or (len(name) == 3 and name.isupper() and not official.startswith(name)):
        return None  # a currency's code (USD100: 一百美元, RMB500元), which wetext reads
    if dash and len(name) == 1 and name.islower():  # a variable: x-1 subtracts
        said = f"{name}减{wetext(number, 'zh')}"
    else:
        said = name + _number_words(name, number, joined=not dash)
    return None if official == said else Reading(said, spoken=True)


_OPERATORS = {"+": "加", "-": "减", "−": "减"}


def _read_power(match: re.Match[str]) -> Reading:
    """`x^2` -> x的平方, `2^10` -> 2的10次方; a sign after it is an operator (x^2-1: x的平方减1; with the
    digit gone wetext read it as a sign, 负一)."""
    exponent = match["exp"]
    said = {"2": "的平方", "3": "的立方", "²": "的平方", "³": "的立方"}.get(exponent, f"的{exponent}次方")
    return Reading(match["base"] + said + _OPERATORS.get(match["op"] or "", ""), spoken=False)


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
        re.compile(
            r"(?P<base>(?<![A-Za-z0-9])[A-Za-z]|\d+(?:\.\d+)?|\))\s*\^\s*(?P<exp>\d+|[A-Za-z])"
            r"(?:\s*(?P<op>[+\-−])\s*(?=[\dA-Za-z(]))?"
        ),
        _read_power,
    ),
    Rule(  # not after m or s: m², s² are units, which wetext reads (平方米)
        "square or cube of a variable",
        re.compile(
            r"(?P<base>(?<![A-Za-z])[a-ln-rt-zA-Z]|\))(?P<exp>[²³])(?:\s*(?P<op>[+\-−])\s*(?=[\dA-Za-z(]))?"
        ),
        _read_power,
    ),
    Rule(
        "plus after a variable", re.compile(r"(?<=[A-Za-z)])\+(?=\d)"), lambda m: Reading("加", spoken=False)
    ),
    Rule("plus after a variable", re.compile(r"(?<=[A-Za-z)])\+(?=\d)"), rewrite("加")),
    Rule("square root", re.compile(r"√\s*(?=[\d(A-Za-z])"), rewrite("根号")),
)
