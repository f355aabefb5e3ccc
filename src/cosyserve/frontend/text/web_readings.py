"""Web addresses and e-mail addresses read the way people say them.

English: wetext already reads `www.example.com/docs` as "WWW dot example dot com slash docs" and
`john.doe@example.com` as "john dot doe at example dot com"; only a scheme (`https://`) comes out as
"HTTPS colon slash slash", which nobody says, so the English rule drops it (see `readings_en`).
Chinese: the official turns every `.` into `。`, so an address splits into sentences; these rules read it as
Chinese speakers do: `www.example.com/docs` -> "WWW点example点com斜杠docs", `@` -> "at", digits one by one.
"""

from __future__ import annotations

import re

from cosyserve.frontend.text.corrections import Reading, Rule

_TLDS = "com|org|net|edu|gov|io|cn|co|uk|de|jp|ai|dev|app|info|me|tv|hk|tw"
_PATH = r"(?:/[A-Za-z0-9._~%/#?=&+-]*[A-Za-z0-9/_~%#=&+-])?"
URL = re.compile(
    r"(?<![A-Za-z0-9@._-])(?:(?:https?|ftp)://[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*"
    rf"|www\.[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.(?:{_TLDS}))"
    rf"{_PATH}(?![A-Za-z0-9@])"
)
EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+(?![A-Za-z0-9-])"
)

ZH_DIGITS = "零一二三四五六七八九"
ZH_SYMBOLS = {
    ".": "点",
    "/": "斜杠",
    "-": "杠",
    "_": "下划线",
    "@": " at ",
    "?": "问号",
    "=": "等于",
    "&": "和",
    "#": "井号",
    "+": "加",
    "%": "百分号",
    "~": "波浪号",
}


def _zh_spell(address: str) -> str:
    """Letters kept (`www` as `WWW`), digits one by one in Chinese, symbols named."""
    parts = []
    for token in re.findall(r"[A-Za-z]+|\d|.", address):
        if token.lower() == "www":
            parts.append("WWW")
        elif token.isdigit():
            parts.append(ZH_DIGITS[int(token)])
        else:
            parts.append(ZH_SYMBOLS.get(token, token))
    return "".join(parts)


def _zh_url(match: re.Match[str]) -> Reading:
    address = re.sub(r"^(?:https?|ftp)://", "", match.group())
    return Reading(_zh_spell(address), spoken=True)


def _zh_email(match: re.Match[str]) -> Reading:
    return Reading(_zh_spell(match.group()), spoken=True)


ZH_RULES: tuple[Rule, ...] = (
    Rule("e-mail address", EMAIL, _zh_email),
    Rule("web address", URL, _zh_url),
)
