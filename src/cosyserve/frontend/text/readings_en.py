"""English reading rules: where wetext's English grammar reads wrong, and what cosyserve reads instead.

Each rule fires only where the official reading is wrong (measured with wetext 0.1.8; the table in
tests/test_readings.py holds the cases): `$12.50` is not "twelve point five dollars", `1,234` keeps its
"one", `2024 people` are not "twenty twenty four people", `1990s` are not "... ninety seconds", `100 m`
is not "one hundred minutes", `2.3.1` is not "two.three point one", `No. 5` does not end a sentence.
"""

from __future__ import annotations

import re

from cosyserve.frontend.text import numbers_en as en
from cosyserve.frontend.text.corrections import Reading, Rule, rewrite
from cosyserve.frontend.text.official import wetext

_NOT_BEFORE = r"(?<![A-Za-z0-9_.,])"  # a number that is not the tail of a word, decimal or digit group
_GROUPED = r"\d{1,3}(?:,\d{3})+"
_SCALE_WORDS = r"\s*(?:thousand|million|billion|trillion|bn|mn|[kmb])\b"

# symbol -> (unit, units, subunit, subunits); no subunit: decimals are read as decimals
CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "¥": ("yen", "yen", None, None),
}


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# A four-digit number after one of these is a year ("in 2024 people moved", "the 2024 elections").
YEAR_CUES = _words(
    "the this that these those its his her their our my your last next "
    "in since by until till from during year circa ca before after early late mid spring summer "
    "autumn fall winter january february march april may june july august september october november "
    "december"
)
IRREGULAR_PLURALS = _words(
    "people men women children feet teeth mice geese sheep deer fish staff police cattle persons"
)
# Words ending in -s that are not plural nouns after a number.
NOT_PLURALS = _words(
    "was does goes says this thus plus minus always perhaps whereas besides sometimes towards "
    "afterwards across unless less news series species"
)


def reads_as_year(number: int) -> bool:
    """Would wetext read this count like a year? It does for 1000..2999 ("twelve thirty four", "ten hundred",
    "twenty three forty five") except 2000..2009 ("two thousand five") and round hundreds ("fifteen hundred"
    is how people say it); measured over 1000..9999."""
    if not 1000 <= number <= 2999 or 2000 <= number <= 2009:
        return False
    return number == 1000 or number % 100 != 0


def unit_after_number(tail: str) -> str:
    """How wetext reads a unit or word after a plural number: " km" -> " kilometers", "%" -> " percent"."""
    if not tail.strip():
        return tail
    spoken = wetext(f"2{tail}", "en")
    return spoken[len("two") :] if spoken.startswith("two") else tail


def _amount(text: str) -> int:
    return int(text.replace(",", ""))


def _read_money(match: re.Match[str]) -> Reading | None:
    integer, fraction = _amount(match["int"]), match["frac"] or ""
    if not fraction and not 1000 <= integer <= 1999:
        return None  # "$5", "$2500", "$12,345": wetext reads these right ("$1,500" loses its "one")
    if integer > en.MAX_CARDINAL:
        return None
    unit, units, subunit, subunits = CURRENCIES[match["cur"]]
    if fraction and (subunit is None or len(fraction) > 2):
        words = f"{en.decimal(str(integer), fraction.rstrip('0'))} {units}"
    else:
        cents = int(fraction.ljust(2, "0")) if fraction else 0
        parts = []
        if integer or not cents:
            parts.append(f"{en.cardinal(integer)} {unit if integer == 1 else units}")
        if cents:
            parts.append(f"{en.cardinal(cents)} {subunit if cents == 1 else subunits}")
        words = " and ".join(parts)
    return Reading(("minus " if match["sign"] else "") + words, spoken=True)


def _read_cents(match: re.Match[str]) -> Reading:
    count = int(match[1])
    return Reading(f"{en.cardinal(count)} {'cent' if count == 1 else 'cents'}", spoken=True)


def _read_grouped(match: re.Match[str]) -> Reading | None:
    """`1,234` -> "one thousand two hundred and thirty four": wetext drops the "one" from 1,000..1,999 unless
    a unit it knows follows without decimals ("1,500 km" is right); other grouped numbers it reads right."""
    integer = _amount(match["int"])
    if not 1000 <= integer <= 1999:
        return None
    tail = match["unit"] or ""
    unit = unit_after_number(tail)
    if unit != tail and not match["frac"]:
        return None
    words = en.decimal(str(integer), match["frac"] or "")
    return Reading(("negative " if match["sign"] else "") + words + unit, spoken=True)


def _is_plural_noun(word: str) -> bool:
    if word in IRREGULAR_PLURALS:
        return True
    return len(word) > 3 and word.endswith("s") and not word.endswith("ss") and word not in NOT_PLURALS


def _read_count(match: re.Match[str]) -> Reading | None:
    number = int(match["num"])
    before = re.findall(r"[A-Za-z]+", match.string[max(0, match.start() - 40) : match.start()])
    if not reads_as_year(number) or not _is_plural_noun(match["noun"]):
        return None
    if before and before[-1].lower() in YEAR_CUES:
        return None
    return Reading(en.cardinal(number), spoken=True)


def _read_decade(match: re.Match[str]) -> Reading | None:
    number = int(match["num"])
    if number % 1000 == 0:
        return None  # "the 2000s": wetext says "two thousands"
    return Reading(en.plural(en.year(number)), spoken=True)


def looks_like_ip_or_date(parts: list[str]) -> bool:
    """`192.168.0.1`, `2024.03.05`, `5.3.2024`: wetext reads these right (and they are no versions)."""
    if len(parts) == 4 and all(int(part) <= 255 for part in parts):
        return True
    return len(parts) == 3 and (len(parts[0]) == 4 or len(parts[-1]) == 4)


def _read_version(match: re.Match[str]) -> Reading | None:
    parts = match["num"].split(".")
    word = match["word"] or ""
    if not word and looks_like_ip_or_date(parts):
        return None
    spoken = " point ".join(en.cardinal(int(p)) for p in parts)
    if word:
        spoken = ("Version " if word == "Version" else "version ") + spoken
    return Reading(spoken, spoken=True)


def _read_phone_plus(match: re.Match[str]) -> Reading | None:
    groups = re.findall(r"\d+", match.group())
    if sum(len(g) for g in groups) < 7:
        return None
    return Reading("plus " + en.grouped_digits(groups), spoken=True)


def _read_phone_cue(match: re.Match[str]) -> Reading:
    return Reading(match["cue"] + en.digits(match["num"]), spoken=True)


def _unit_rewrite(match: re.Match[str]) -> Reading:
    singular, plural = UNIT_WORDS[match["unit"]]
    return Reading(f"{match['num']} {singular if match['num'] == '1' else plural}", spoken=False)


# Units wetext reads wrong after a number ("m" as minutes, "L" and "kWh" left as letters).
UNIT_WORDS = {
    "m": ("meter", "meters"),
    "m/s": ("meter per second", "meters per second"),
    "L": ("liter", "liters"),
    "kWh": ("kilowatt hour", "kilowatt hours"),
}
_NUMBER = rf"{_GROUPED}(?:\.\d+)?|\d+(?:\.\d+)?"

_POWERS = {"2": "squared", "3": "cubed"}
# what may follow a power: an operator before the next term, or a letter or digit right after it
_AFTER_POWER = r"(?:\s*(?P<op>[+\-−])\s*(?=[\dA-Za-z(]))?(?=(?P<next>[A-Za-z0-9])|)"


def _read_power(match: re.Match[str]) -> Reading | None:
    """`2^10` -> 2 to the power of 10, `x²` -> x squared, `x^2-1` -> x squared minus 1 (wetext: two
    circumflex ten, x², x^two-1); None where wetext reads it right in its sentence (`Then x^2.`)."""
    exponent = {"²": "2", "³": "3"}.get(match["exp"], match["exp"])
    written = f"{match['base']} {_POWERS.get(exponent, 'to the power of ' + exponent)}"
    operator = {"+": " plus ", "-": " minus ", "−": " minus "}.get(match["op"] or "")
    written += operator or (" " if match["next"] else "")  # a²b: a squared b
    alone = match["exp"].isdigit() and operator is None and match.string.count("^") == 1
    if alone and wetext(match.group(), "en") == wetext(written, "en"):
        return None  # `Then x^2.`: x squared
    return Reading(written, spoken=False)


RULES: tuple[Rule, ...] = (
    Rule("minus sign", re.compile(r"\u2212(?=\d)"), rewrite("-")),
    Rule("web address scheme", re.compile(r"\b(?:https?|ftp)://(?=[A-Za-z0-9])"), rewrite("")),
    Rule(
        "international phone number",
        re.compile(r"(?<![A-Za-z0-9_+])\+\d{1,3}(?:[\s.-]?\(?\d{1,4}\)?){2,5}(?!\d)"),
        _read_phone_plus,
    ),
    Rule(
        "phone number",
        re.compile(
            r"\b(?P<cue>(?:call|phone|tel|dial|fax|mobile|text)(?:\s+(?:me|us|him|her|them))?"
            r"(?:\s+(?:at|on))?[:.]?\s+)(?P<num>\d{7,15})(?![\d.,]\d|\d)",
            re.IGNORECASE,
        ),
        _read_phone_cue,
    ),
    Rule(
        "version number",
        re.compile(
            r"(?<![A-Za-z0-9_.])(?:(?P<word>[Vv]ersion|[Vv]er\.|[Vv])\s?(?=\d+\.\d)|(?=\d+(?:\.\d+){2}))"
            r"(?P<num>\d+(?:\.\d+)+)(?![A-Za-z0-9_]|\.\d)"
        ),
        _read_version,
    ),
    Rule(
        "money",
        re.compile(
            rf"{_NOT_BEFORE}(?P<sign>-)?(?P<cur>[$€£¥])\s?(?P<int>{_GROUPED}|\d+)(?:\.(?P<frac>\d+))?"
            rf"(?!\d|,\d|\.\d|{_SCALE_WORDS})",
            re.IGNORECASE,
        ),
        _read_money,
    ),
    Rule("cents", re.compile(rf"{_NOT_BEFORE}(\d+)\s?¢"), _read_cents),
    Rule(
        "unit",
        re.compile(rf"(?<![A-Za-z0-9_.,$€£¥])(?P<num>{_NUMBER})\s?(?P<unit>m/s|m|L|kWh)(?![A-Za-z0-9_/²³])"),
        _unit_rewrite,
    ),
    Rule(
        "range with a dash",
        re.compile(rf"{_NOT_BEFORE}({_NUMBER})(%?)\s*[–—]\s*({_NUMBER})(%?)(?![\d])"),
        lambda m: Reading(f"{m[1]} to {m[3]}{'%' if m[2] or m[4] else ''}", spoken=False),
    ),
    Rule(
        "percentage range",
        re.compile(rf"{_NOT_BEFORE}(\d+(?:\.\d+)?)%\s*-\s*(\d+(?:\.\d+)?)%"),
        rewrite(r"\1 to \2%"),
    ),
    Rule(
        "thousands separators",
        re.compile(
            rf"{_NOT_BEFORE}(?P<sign>-)?(?P<int>{_GROUPED})(?:\.(?P<frac>\d+))?(?!\d|,\d|\.\d)"
            r"(?P<unit>\s?(?:%|°[CF]|[A-Za-z]{1,4}(?:/[A-Za-z]{1,2})?)(?![A-Za-z0-9_/]))?"
        ),
        _read_grouped,
    ),
    Rule(
        "number, not a year",
        re.compile(r"(?<![A-Za-z0-9_.,$€£¥-])(?P<num>\d{4})(?=\s+(?P<noun>[a-z]+)\b)"),
        _read_count,
    ),
    Rule("decade", re.compile(r"(?<![A-Za-z0-9_.,'’])(?P<num>1[1-9]\d0|20\d0)s\b"), _read_decade),
    Rule("number sign", re.compile(r"(?<![A-Za-z0-9_])(?:No\.|NO\.|#)\s?(?=\d)"), rewrite("number ")),
    Rule(
        "power",
        re.compile(
            rf"(?P<base>(?<![A-Za-z0-9])[A-Za-z]|\d+(?:\.\d+)?|\))\s*\^\s*(?P<exp>\d+|[A-Za-z]){_AFTER_POWER}"
        ),
        _read_power,
    ),
    Rule(  # not after m or s: m², s² are units (wetext reads "square meters")
        "square or cube of a variable",
        re.compile(rf"(?P<base>(?<![A-Za-z])[a-ln-rt-zA-Z]|\))(?P<exp>[²³]){_AFTER_POWER}"),
        _read_power,
    ),
    Rule("square root", re.compile(r"√\s*(?=[\d(A-Za-z])"), rewrite("the square root of ")),
)
