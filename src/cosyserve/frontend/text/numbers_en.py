"""English number words for cosyserve's own readings, in the style wetext uses for the numbers it gets right.

wetext says "and" only inside the last group ("nine hundred ninety nine thousand nine hundred and ninety
nine", "twelve thousand and five"), so spoken numbers read the same whether wetext or a correction made them.
"""

from __future__ import annotations

ONES = (
    *("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"),
    *("eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"),
)
TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))
MAX_CARDINAL = 10**15 - 1


def _below_hundred(number: int) -> str:
    if number < 20:
        return ONES[number]
    tens, ones = divmod(number, 10)
    return TENS[tens] + (f" {ONES[ones]}" if ones else "")


def _below_thousand(number: int, last_group: bool) -> str:
    hundreds, rest = divmod(number, 100)
    words = [f"{ONES[hundreds]} hundred"] if hundreds else []
    if rest:
        if hundreds and last_group:
            words.append("and")
        words.append(_below_hundred(rest))
    return " ".join(words)


def cardinal(number: int) -> str:
    """0 <= number <= MAX_CARDINAL -> words: 1234 -> "one thousand two hundred and thirty four"."""
    if not 0 <= number <= MAX_CARDINAL:
        raise ValueError(f"{number} is outside 0..{MAX_CARDINAL}")
    if number == 0:
        return "zero"
    words: list[str] = []
    for scale, name in SCALES:
        if number >= scale:
            high, number = divmod(number, scale)
            words.append(f"{_below_thousand(high, last_group=False)} {name}")
    if number:
        if words and number < 100:
            words.append("and")
        words.append(_below_thousand(number, last_group=True))
    return " ".join(words)


def digits(text: str) -> str:
    """Each digit of `text` as a word: "0810" -> "zero eight one zero"."""
    return " ".join(ONES[int(d)] for d in text if d.isdigit())


def grouped_digits(groups: list[str]) -> str:
    """Digit groups read digit by digit, a pause between: ["555", "12"] -> "five five five, one two"."""
    return ", ".join(digits(group) for group in groups if group)


def decimal(integer: str, fraction: str) -> str:
    """("12", "345") -> "twelve point three four five" (fraction digit by digit); ("12", "") -> "twelve"."""
    words = cardinal(int(integer or "0"))
    return f"{words} point {digits(fraction)}" if fraction else words


def plural(words: str) -> str:
    """The plural of a number's last word: "nineteen ninety" -> "nineteen nineties", "ten" -> "tens"."""
    if words.endswith("y"):
        return words[:-1] + "ies"
    if words.endswith("x"):
        return words + "es"
    return words + "s"


def year(number: int) -> str:
    """A year as said: 1990 -> "nineteen ninety", 1905 -> "nineteen oh five", 1900 -> "nineteen hundred",
    2000..2009 -> "two thousand (and) ...", 2010 -> "twenty ten"."""
    century, rest = divmod(number, 100)
    if 2000 <= number <= 2009 or number % 1000 == 0:
        return cardinal(number)
    if rest == 0:
        return f"{_below_hundred(century)} hundred"
    if rest < 10:
        return f"{_below_hundred(century)} oh {ONES[rest]}"
    return f"{_below_hundred(century)} {_below_hundred(rest)}"
