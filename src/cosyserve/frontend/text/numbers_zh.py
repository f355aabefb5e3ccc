"""Whole numbers in Chinese words, for the readings wetext gets wrong: an ordinal of five digits or more
(it reads `第12345` digit by digit) and a count of 13 to 16 digits (it reads 10^12 as 一千亿零)."""

from __future__ import annotations

DIGITS = "零一二三四五六七八九"
_PLACES = ("", "十", "百", "千")
LARGEST = 10**16 - 1  # up to 万亿 (9999万亿…); longer numbers are read digit by digit


def _four(number: int) -> str:
    """0 < number < 10000 in words, inner zeros said once (1005: 一千零五), trailing ones not."""
    words, pending_zero = [], False
    for place in range(3, -1, -1):
        digit = number // 10**place % 10
        if digit == 0:
            pending_zero = bool(words)
            continue
        if pending_zero:
            words.append("零")
            pending_zero = False
        words.append(DIGITS[digit] + _PLACES[place])
    return "".join(words)


def _grouped(number: int, size: int, unit: str, lower: int) -> str:
    """`number` as (high)(unit)(low), with 零 where the low part skips its leading places."""
    high, low = divmod(number, size)
    if high == 0:
        return _words(low)
    said = _words(high) + unit
    if low == 0:
        return said
    return said + ("零" if low < lower else "") + _words(low)


def _words(number: int) -> str:
    if number >= 10**8:
        return _grouped(number, 10**8, "亿", 10**7)
    if number >= 10**4:
        return _grouped(number, 10**4, "万", 10**3)
    return _four(number)


def cardinal_zh(number: int) -> str:
    """`number` in Chinese words with 二 for every 2 (an ordinal's reading; `第2000` 第二千):
    12345 -> 一万二千三百四十五, 10**12 -> 一万亿, 15 -> 十五, 100000001 -> 一亿零一. A number above
    `LARGEST` is read digit by digit."""
    if number < 0:
        raise ValueError(f"{number} is negative")
    if number == 0:
        return DIGITS[0]
    if number > LARGEST:
        return "".join(DIGITS[int(digit)] for digit in str(number))
    said = _words(number)
    return said[1:] if said.startswith("一十") else said  # 十五, 十万, not 一十五
