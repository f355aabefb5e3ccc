"""What a user reads in the web UI for an error, in the page's language: a problem the UI finds itself
(`UiError`), one the service raised (the error table's translated sentence, else its own message), and
one stored with a job or a batch item (its code, read back later).
"""

from __future__ import annotations

import re
from typing import Any

from cosyserve.errors import ERROR_TABLE, CosyServeError, error_kind
from cosyserve.limits import AUDIO_SUFFIX_LIST
from cosyserve.ui.bridge import UploadRefused
from cosyserve.ui.i18n import text
from cosyserve.ui.i18n_errors import with_lead

__all__ = ["UiError", "as_written", "error_message", "stored_error_message"]

# Characters that could start Markdown or HTML, written as numeric character references: a backslash
# escape was undone by a web address right before it (the address took the backslash in, and the `<img`
# after it became a real tag in the admin's page); a reference is read as the character, never as markup.
# A web address's `:` and a domain's dots too, so that no address becomes a link.
_MARKUP = re.compile(r"[\\`*_\[\]~<>&|!#@]|:(?=//)|(?<=[A-Za-z0-9])\.(?=[A-Za-z])|(?<=[wW]{3})\.")


def as_written(value: object) -> str:
    """A user's words (a name, a transcript) for a Markdown component, shown as written and never
    rendered: a transcript holding a `<form>` or an image was rendered in the admin's page."""
    return _MARKUP.sub(lambda m: f"&#{ord(m.group())};", " ".join(str(value).splitlines()))


# a stored error's code -> the translated sentence of its kind: the last row with that code, its most
# general class (a subclass's sentence, as a voice name's for `invalid_input`, is not every such error's)
_UI_KEYS: dict[str, str | None] = {kind.code: kind.ui_key for _cls, kind in ERROR_TABLE}


class UiError(Exception):
    """A problem the UI finds itself, named by a STRINGS key (translated when shown)."""

    def __init__(self, key: str, **values: Any) -> None:
        super().__init__(key)
        self.key, self.values = key, values


def error_message(exc: BaseException, lang: str, request_id: str | None = None) -> str:
    """What the user reads for `exc` (plain text)."""
    if isinstance(exc, UiError):
        return text(exc.key, lang, **exc.values)
    if isinstance(exc, UploadRefused):
        p = exc.problem
        if p.kind == "type":
            return text("err_bad_file", lang, suffix=p.suffix, formats=AUDIO_SUFFIX_LIST)
        if p.kind == "gone":
            return text("err_upload_gone", lang)
        return text("err_big_file", lang, size=p.size_mb, limit=p.limit_mb)
    if not isinstance(exc, CosyServeError):  # a bug: the details go to the log, not the page
        return text("err_internal", lang, request_id=request_id or "-")
    kind = error_kind(exc)  # the error table says which errors get a translated sentence
    key = kind.ui_key
    if key is None:
        return with_lead(kind.code, str(exc), lang)
    return text(key, lang, seconds=getattr(exc, "retry_after_s", None), message=str(exc))


def stored_error_message(code: str | None, message: str | None, lang: str) -> str:
    """What the user reads for an error stored with a job or a batch item (its code and the service's
    message): the translated sentence of its kind, else the message."""
    if not code:
        return ""
    key = _UI_KEYS.get(code)
    if key is None:
        return with_lead(code, message or "", lang) or code
    return text(key, lang, seconds=None, message=message or "")
