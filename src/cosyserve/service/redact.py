"""Passwords out of what the server shows: a URL's `user:password@` becomes `user:***@`.

The queue and database URLs carry their password inline (`redis://:pw@host/0`,
`postgresql+psycopg://cosy:pw@db/cosy`); `/admin/status`, `--print-config` and error messages show the
settings, so every string that parses as such a URL is shown with the password masked.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

MASK = "***"


def masked_url(value: str) -> str:
    """`value` with the password of its URL's userinfo masked; anything else unchanged."""
    if "@" not in value or "://" not in value:
        return value
    try:
        parts = urlsplit(value)
        if parts.password is None:
            return value
    except ValueError:  # not a URL after all (a port that is no number, …)
        return value
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}"))


def without_passwords(data: Any) -> Any:
    """`data` (JSON-like: dicts, lists, strings) with every URL's password masked."""
    if isinstance(data, str):
        return masked_url(data)
    if isinstance(data, dict):
        return {key: without_passwords(value) for key, value in data.items()}
    if isinstance(data, list):
        return [without_passwords(value) for value in data]
    return data
