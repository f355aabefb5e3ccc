"""Who is calling: the principal of a page request, resolved from the same credentials the API takes (the
login's session cookie, an API key in a header, or nobody when the server has no authentication)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cosyserve.service.access.principals import AuthRequired, Principal
from cosyserve.service.access.sessions import SESSION_COOKIE
from cosyserve.service.assembly import Service


class SessionPart:
    """The UI bridge's part that says who is calling."""

    service: Service

    def principal(self, headers: Mapping[str, str], cookies: Mapping[str, str]) -> Principal | None:
        """Like the API: an API key in a header, the login's session cookie (whether by key or password),
        or anonymous with full rights when the server has no authentication at all; None: not signed in."""
        return self.service.access.identify(_header_key(headers), cookies.get(SESSION_COOKIE))

    def principal_of(self, request: Any) -> Principal:
        """The principal of a Gradio request; AuthRequired when its credentials are gone or invalid."""
        headers = dict(getattr(request, "headers", None) or {})
        cookies = dict(getattr(request, "cookies", None) or {})
        found = self.principal(headers, cookies)
        if found is None:
            raise AuthRequired("not signed in: log in again")
        return found


def _header_key(headers: Mapping[str, str]) -> str | None:
    lowered = {k.lower(): v for k, v in headers.items()}
    scheme, _, value = lowered.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return lowered.get("x-api-key", "").strip() or None
