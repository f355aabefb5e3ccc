"""Cross-origin requests: only the origins in `cors_origins` get CORS answers, on the API and the web UI.

Gradio's own CORS middleware (on the mounted UI) echoes any origin back with credentials whenever the
server is reached by a name other than localhost, and any localhost origin (whatever its port) when it
is: a page on http://localhost:9999 could read the UI's answers with the user's cookies. This middleware
wraps the whole app, so whatever an inner layer adds, the browser sees one policy:

- a request without `Origin`, or from an origin not configured: every `Access-Control-*` header is removed
  from the answer (same-origin pages need none), a preflight's too, so the browser refuses the call;
- a configured origin: a preflight is answered here, and answers carry `Access-Control-Allow-Origin`
  with credentials allowed and the API's headers exposed;
- `*` configured: any other origin gets `Access-Control-Allow-Origin: *` without credentials, so a
  browser never sends or reveals a user's cookies for it.
"""

from __future__ import annotations

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ALLOWED_METHODS = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"
PREFLIGHT_MAX_AGE_S = 600


class CorsPolicy:
    """ASGI middleware: CORS answers for `origins` only (see the module's docstring)."""

    def __init__(self, app: ASGIApp, origins: list[str], expose_headers: list[str]) -> None:
        self.app = app
        self.any_origin = "*" in origins
        self.origins = frozenset(origin.rstrip("/").lower() for origin in origins if origin != "*")
        self.expose_headers = ", ".join(expose_headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        credentialed = origin is not None and origin.rstrip("/").lower() in self.origins
        # what Access-Control-Allow-Origin says, if anything
        answer = origin if credentialed else "*" if origin is not None and self.any_origin else None
        preflight = scope["method"] == "OPTIONS" and "access-control-request-method" in headers
        if preflight and answer is not None:
            await self._preflight(answer, headers, send)
            return

        async def send_with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                response_headers = MutableHeaders(scope=message)
                for name in {name for name in response_headers if name.startswith("access-control-")}:
                    del response_headers[name]
                if answer is not None:
                    self._allow(response_headers, answer, credentialed)
                if origin is not None:
                    _vary_on_origin(response_headers)
            await send(message)

        await self.app(scope, receive, send_with_policy)

    async def _preflight(self, origin: str, headers: Headers, send: Send) -> None:
        """The answer to an allowed origin's preflight: any method, the headers it asked for."""
        start: Message = {"type": "http.response.start", "status": 204, "headers": []}
        response_headers = MutableHeaders(scope=start)
        response_headers["access-control-allow-methods"] = ALLOWED_METHODS
        response_headers["access-control-max-age"] = str(PREFLIGHT_MAX_AGE_S)
        requested = headers.get("access-control-request-headers")
        if requested:
            response_headers["access-control-allow-headers"] = requested
        _vary_on_origin(response_headers)
        self._allow(response_headers, origin, origin != "*")
        await send(start)
        await send({"type": "http.response.body", "body": b""})

    def _allow(self, headers: MutableHeaders, origin: str, credentialed: bool) -> None:
        headers["access-control-allow-origin"] = origin
        if credentialed:
            headers["access-control-allow-credentials"] = "true"
        if self.expose_headers:
            headers["access-control-expose-headers"] = self.expose_headers


def _vary_on_origin(headers: MutableHeaders) -> None:
    """The answer depends on `Origin` (caches must not serve one origin's answer to another), said once."""
    present = {part.strip().lower() for part in headers.get("vary", "").split(",")}
    if "origin" not in present and "*" not in present:
        headers.add_vary_header("Origin")
