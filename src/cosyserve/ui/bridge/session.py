"""Who is calling: the principal of a page request, resolved from the same credentials the API takes (the
login's session cookie, an API key in a header, or nobody when the server has no authentication), and the
login form's calls (a key or a password for a session, logging out), each logged as activity."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cosyserve.service.access.principals import AuthRequired, Principal
from cosyserve.service.access.sessions import SESSION_COOKIE, header_key
from cosyserve.service.activity import log_activity
from cosyserve.service.assembly import Service


class SessionPart:
    """The UI bridge's part that says who is calling."""

    service: Service

    def principal(
        self, headers: Mapping[str, str], cookies: Mapping[str, str], *, touch: bool = False
    ) -> Principal | None:
        """Like the API: an API key in a header, the login's session cookie (whether by key or password),
        or anonymous with full rights when the server has no authentication at all; None: not signed in.
        `touch`: the request counts as the user's activity (the HTTP layer decides: `ui.login`)."""
        key, token = header_key(headers), cookies.get(SESSION_COOKIE)
        return self.service.access.identify(key, token, touch=touch)

    def principal_of(self, request: Any) -> Principal:
        """The principal of a Gradio request; AuthRequired when its credentials are gone or invalid."""
        headers = dict(getattr(request, "headers", None) or {})
        cookies = dict(getattr(request, "cookies", None) or {})
        found = self.principal(headers, cookies)
        if found is None:
            raise AuthRequired("not signed in: log in again")
        return found

    def auth_enabled(self) -> bool:
        return self.service.access.auth_enabled()

    @property
    def password_login_configured(self) -> bool:
        """Whether the login form offers a user name and password (besides an API key)."""
        return self.service.settings.auth.ui_login_configured

    def key_login(self, key: str) -> str | None:
        """A session token for a valid API key (None for any other), the attempt logged."""
        try:
            found, token = self.service.access.key_login(key)
        except AuthRequired:
            found, token = None, None
        log_activity("login", "ok" if found else "bad_key", who=found.name if found else None, endpoint="ui")
        return token

    def password_login(self, username: str, password: str) -> str | None:
        """A session token for the UI's user name and password (None when they are wrong), logged."""
        try:
            token = self.service.access.login(username, password)
        except AuthRequired:
            token = None
        who = self.service.access.logged_name(username)
        log_activity("login", "ok" if token else "bad_password", who=who, endpoint="ui")
        return token

    def logout(self, token: str | None) -> None:
        self.service.access.logout(token)

    def session_cookie(self, token: str, *, secure: bool) -> dict[str, Any]:
        """The `Response.set_cookie` arguments of the session cookie for `token`."""
        return self.service.access.session_cookie(token, secure=secure)
