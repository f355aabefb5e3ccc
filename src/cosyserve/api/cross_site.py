"""Requests a browser sends on another site's behalf do not act for its user (cross-site request forgery).

A signed-in user's browser sends the session cookie with every request to this server, whoever made the
page asking: a page on another port of the same host (`SameSite=Lax` cookies go along) posted a batch and
enrolled a voice in the user's account, an image tag ran a voice preview (an output stored, quota spent)
and signed the user out, and a form on any site signed the user in as someone else (a team's run).

So a request that acts (any method but GET, HEAD and OPTIONS, and the GETs that act: a voice preview,
`/logout`) and that a browser marks as coming from another origin is refused with 403 `cross_site`:
browsers mark it with `Sec-Fetch-Site` (`same-site` or `cross-site`), older ones only with an `Origin`
unlike the server's own. Requests with an API key in a header (`Authorization: Bearer`, `X-API-Key`) are
the key holder's own (no browser adds one on another page's behalf) and pass, as do the origins
configured in `--cors-origins` and clients that send neither header (curl, SDKs). Other `Authorization`
schemes do not: a browser adds a proxy's Basic or Negotiate credentials to every request to the site,
whichever page asked (behind an HTTP-auth proxy any header had switched this check off).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from cosyserve.api.errors import error_body
from cosyserve.service.access.sessions import header_key
from cosyserve.service.logs import get_request_id

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ACTING_GETS = re.compile(r"^/(logout|v1/voices/[^/]+/preview)/?$")  # GETs that change something
FOREIGN_SITES = frozenset({"same-site", "cross-site"})


class CrossSiteGuard:
    """ASGI middleware refusing acting requests a browser sent from another origin (module docstring)."""

    def __init__(self, app: ASGIApp, trusted_origins: list[str]) -> None:
        self.app = app
        self.trusted = frozenset(origin.rstrip("/").lower() for origin in trusted_origins if origin != "*")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.forged(scope):
            await self.refuse(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def forged(self, scope: Scope) -> bool:
        """Whether `scope` acts and a browser sent it from an origin that is neither ours nor trusted."""
        method, path = scope["method"], scope["path"]
        if method in SAFE_METHODS and not ACTING_GETS.match(path):
            return False
        headers = Headers(scope=scope)
        if header_key(headers) is not None:
            return False  # a key the caller holds itself
        origin = (headers.get("origin") or "").rstrip("/").lower()
        if origin and origin in self.trusted:
            return False
        site = headers.get("sec-fetch-site")
        if site is not None:
            return site in FOREIGN_SITES
        return bool(origin) and (origin == "null" or not _same_host(origin, headers.get("host")))

    async def refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = (
            f"{scope['method']} {scope['path']} came from another site's page: refused, so that no page can "
            "act for a signed-in user (open this server's own page, or call the API with a key)"
        )
        body = error_body(403, "cross_site", message, get_request_id())
        await JSONResponse(body, status_code=403)(scope, receive, send)


def _same_host(origin: str, host: str | None) -> bool:
    """Whether `origin` names the host (and port) the request was sent to."""
    try:
        return bool(host) and urlsplit(origin).netloc == host.lower()
    except ValueError:
        return False
