"""The outermost layer of every HTTP request: request id, body size limit, metrics, access log, last resort.

A plain ASGI middleware (not Starlette's BaseHTTPMiddleware), so streaming responses and client
disconnects pass through untouched. An exception nothing else handled becomes the 500 envelope here;
once a response has started it can only be logged, and the connection is closed mid-body so the client
sees an incomplete response instead of a truncated one that looks whole.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.routing import Mount, compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cosyserve.api.body_budget import BodyBudget, FreedMemoryReleaser
from cosyserve.api.errors import (
    CLIENT_CLOSED,
    BodyTooLarge,
    body_cap_bytes,
    body_too_large_message,
    envelope,
    error_body,
    error_response,
)
from cosyserve.api.security_headers import credentialed, secured
from cosyserve.errors import BodyStalled
from cosyserve.service.logs import new_request_id, reset_request_id, set_request_id

access_log = logging.getLogger("cosyserve.access")
REQUEST_ID_HEADER = "x-request-id"
_SAFE_ID = re.compile(r"[A-Za-z0-9._\-]{1,64}")
_QUIET_PATHS = ("/health", "/ready", "/metrics", "/v1/me")  # polled (/v1/me: every open page): DEBUG
_QUIET_PREFIXES = ("/assets/", "/gradio_api/", "/static/")  # the web UI's own traffic
BUSY_RETRY_AFTER_S = 5
HTTP_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
_MAX_HELD_BODY = 64 * 1024  # a bare `{"detail": ...}` error is far smaller: larger bodies pass through


def request_id_for(incoming: str) -> str:
    """A request's id: the server's own, which no other request has, led by the client's (a proxy's, a
    trace) when it sent a usable one: two users sending one id shared log lines, and an admin's output
    lookup by it found only one of theirs."""
    return f"{incoming[:47]}.{new_request_id()}" if _SAFE_ID.fullmatch(incoming) else new_request_id()


def final_status(status: list[int], whole: bool, cut_off: list[int]) -> int:
    """What a request is counted and logged as: its status; 500 when none was sent; for an answer begun
    and not `whole`, the error that cut it off or 499 (a stream left by its client was a 200)."""
    if not status:
        return 500
    if not whole:
        return cut_off[0] if cut_off else CLIENT_CLOSED
    return status[0]


class ApiMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        metrics: Any,
        upload_limit_bytes: int,
        body_budget: BodyBudget | None = None,
        admit: Callable[[Mapping[str, str]], bool] | None = None,
    ) -> None:
        self.app = app
        # whether a request's credentials let it in: asked before a large body takes budget (the budget
        # is shared: three idle connections without a key held it all, and every upload waited)
        self.admit = admit
        self.metrics = metrics
        self.upload_limit_bytes = upload_limit_bytes
        self.max_body_bytes = body_cap_bytes(upload_limit_bytes)
        self.body_budget = body_budget
        self.releaser = FreedMemoryReleaser()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        request_id = request_id_for(headers.get(REQUEST_ID_HEADER, ""))
        token = set_request_id(request_id)
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.perf_counter()
        status: list[int] = []
        ended: list[bool] = []  # the body's last part went out: the answer is whole
        cut_off: list[int] = []  # the status of the error that cut a begun answer off

        private = credentialed(headers)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
                message.setdefault("headers", [])
                message["headers"] = [
                    *secured(list(message["headers"]), private=private),
                    (b"x-request-id", request_id.encode("latin-1")),
                ]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                ended.append(True)
            await send(message)

        send_with_id = _EnvelopeForeignErrors(send_with_id, scope, request_id)

        received = 0
        limit = self.max_body_bytes
        held = 0  # bytes reserved in the body budget until the body has been received
        declared = headers.get("content-length", "")
        body_done = declared in ("", "0") and "transfer-encoding" not in headers

        async def limited_receive() -> Message:
            nonlocal received, held, body_done
            message = await (receive() if body_done else body_part(receive))
            if message["type"] == "http.request":
                body_done = body_done or not message.get("more_body", False)
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(self.upload_limit_bytes, scope.get("path", ""))
                if held and message.get("more_body", False):
                    check_body_rate(received, time.perf_counter() - started)
                if held and not message.get("more_body", False):
                    await self._release(held)
                    held = 0
            return message

        try:
            size = int(declared) if declared.isdigit() else (limit if "transfer-encoding" in headers else 0)
            if size > limit:
                message = body_too_large_message(self.upload_limit_bytes, scope.get("path", ""))
                response = envelope(413, "payload_too_large", message)
                await response(scope, receive, send_with_id)
            elif self.body_budget is not None and self.body_budget.counts(size):
                if self.admit is not None and not await run_in_threadpool(self.admit, headers):
                    await envelope(401, "auth_required", UNADMITTED)(scope, receive, send_with_id)
                elif await self.body_budget.acquire(size):
                    held = size
                    await self.app(scope, limited_receive, send_with_id)
                else:
                    await self._busy()(scope, receive, send_with_id)
            else:
                await self.app(scope, limited_receive, send_with_id)
        except Exception as exc:
            if not status:
                await error_response(exc, self.metrics)(scope, receive, send_with_id)
            else:  # logs and counts it as what it is; the body is cut off
                cut_off.append(error_response(started_response_error(exc), self.metrics).status_code)
        finally:
            if held:
                await self._release(held)
            if self.body_budget is not None and self.body_budget.counts(received):
                self.releaser.soon()  # the body's memory is garbage now: give it back to the system
            # (the web UI's event streams end when their page closes: not a request left midway)
            whole = bool(ended) or scope.get("path", "").startswith(_QUIET_PREFIXES)
            self._record(scope, final_status(status, whole, cut_off), time.perf_counter() - started)
            reset_request_id(token)

    def _record(self, scope: Scope, code: int, elapsed: float) -> None:
        """Count the request by its route template and write the access log line."""
        self.metrics.observe_request(route_label(scope.get("route")), code, elapsed)
        path = scope.get("path", "")
        quiet = path in _QUIET_PATHS or path.startswith(_QUIET_PREFIXES)
        level = logging.DEBUG if quiet and code < 400 else logging.INFO
        access_log.log(
            level,
            "%s %s %d %.3fs",
            scope.get("method", "-"),
            path,
            code,
            elapsed,
            extra={"client": (scope.get("client") or ("-",))[0]},
        )

    async def _release(self, nbytes: int) -> None:
        if self.body_budget is not None:
            await self.body_budget.release(nbytes)

    def _busy(self) -> Any:
        budget = self.body_budget
        assert budget is not None
        return envelope(
            503,
            "server_busy",
            f"too many large request bodies are being received at once ({budget.in_use / 1e6:.0f} MB of "
            f"the {budget.max_bytes / 1e6:.0f} MB allowed): retry in a few seconds",
            {"Retry-After": str(BUSY_RETRY_AFTER_S)},
        )


UNADMITTED = "sign in or send an API key (Authorization: Bearer <key>) before sending a large body"
BODY_STALL_S = 30.0  # a body with no byte for this long is given up (its budget freed)
# A large body holds its declared size of the budget while it arrives: one trickling a byte now and then
# held it for as long as its sender chose, and others' uploads got 503s. After the first BODY_STALL_S it
# must keep this average rate (a 20 MB recording at 32 KB/s takes ten minutes).
MIN_BODY_BYTES_PER_S = 32_000


def check_body_rate(received: int, elapsed_s: float) -> None:
    """BodyStalled for a large body arriving slower than MIN_BODY_BYTES_PER_S on average, after its
    first BODY_STALL_S."""
    if elapsed_s > BODY_STALL_S and received < MIN_BODY_BYTES_PER_S * elapsed_s:
        rate = received / elapsed_s / 1000
        raise BodyStalled(
            f"the request body arrives at {rate:.1f} kB/s, below the {MIN_BODY_BYTES_PER_S // 1000} kB/s a "
            "large upload must keep: send it again over a faster connection"
        )


async def body_part(receive: Receive) -> Message:
    """The next part of a request body; BodyStalled when none comes within BODY_STALL_S."""
    try:
        return await asyncio.wait_for(receive(), BODY_STALL_S)
    except asyncio.TimeoutError:
        raise BodyStalled(
            f"the request body stopped arriving (nothing for {BODY_STALL_S:.0f} s): send it again"
        ) from None


class _EnvelopeForeignErrors:
    """Rewrites `{"detail": ...}` 404/405 answers of mounted apps (the web UI takes every path the API
    doesn't) into the error envelope, so an unknown route looks like every other error."""

    def __init__(self, send: Send, scope: Scope, request_id: str) -> None:
        # a copy: the mounted UI writes its own app and paths into the scope it is given
        self.send, self.scope, self.request_id = send, dict(scope), request_id
        self.start: Message | None = None
        self.body = b""

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] in (404, 405):
            content_type = dict(message.get("headers", [])).get(b"content-type", b"")
            if content_type.startswith(b"application/json"):
                self.start = message  # held until the body shows whether it is a bare `detail`
                return
        if self.start is None or message["type"] != "http.response.body":
            await self.send(message)
            return
        self.body += message.get("body", b"")
        if message.get("more_body", False) and len(self.body) < _MAX_HELD_BODY:
            return
        start, body, self.start = self.start, self.body, None
        if not message.get("more_body", False):
            replaced = self._envelope(start, body)
            if replaced is not None:
                start, body = replaced
        await self.send(start)
        await self.send(
            {"type": "http.response.body", "body": body, "more_body": message.get("more_body", False)}
        )

    def _envelope(self, start: Message, body: bytes) -> tuple[Message, bytes] | None:
        status = start["status"]
        try:
            detail = json.loads(body)
        except ValueError:
            return None
        if not (isinstance(detail, dict) and set(detail) == {"detail"}):
            return None
        method, path = self.scope.get("method", "-"), self.scope.get("path", "")
        allowed = _api_methods(self.scope) if status == 404 else []
        extra: list[tuple[bytes, bytes]] = []
        if allowed:  # an API route taken by the web UI at "/" because the method was not the route's
            status, extra = 405, [(b"allow", ", ".join(allowed).encode())]
            code = "method_not_allowed"
            text = f"{method} is not allowed on {path}: use {' or '.join(allowed)} (see /docs)"
        elif status == 404:
            code, text = "not_found", f"no such endpoint: {method} {path} (see /docs)"
        else:
            code, text = "method_not_allowed", f"{method} is not allowed on {path} (see /docs)"
        payload = error_body(status, code, text, self.request_id)
        encoded = json.dumps(payload).encode()
        kept = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        headers = [*kept, *extra, (b"content-length", str(len(encoded)).encode())]
        return {"type": "http.response.start", "status": status, "headers": headers}, encoded


def _api_methods(scope: Scope) -> list[str]:
    """The methods of the API operation whose path `scope` has (its method not one of them), or []. From
    the app's OpenAPI paths: public, where its router's own route list wraps included routers."""
    app = scope.get("app")
    if app is None or not callable(getattr(app, "openapi", None)):
        return []
    path = scope.get("path", "")
    return next((methods for pattern, methods in _operations(app) if pattern.fullmatch(path)), [])


_OPERATIONS: weakref.WeakKeyDictionary[Any, list[tuple[re.Pattern[str], list[str]]]] = (
    weakref.WeakKeyDictionary()
)


def _operations(app: Any) -> list[tuple[re.Pattern[str], list[str]]]:
    """(path pattern, methods) of each API operation, compiled once per app (asked on every foreign 404)."""
    found = _OPERATIONS.get(app)
    if found is None:
        found = [
            (compile_path(template)[0], sorted(m.upper() for m in operations if m.upper() in HTTP_METHODS))
            for template, operations in app.openapi().get("paths", {}).items()
        ]
        _OPERATIONS[app] = found
    return found


def route_label(route: Any) -> str:
    """The route template (bounded label values): `/v1/jobs/{job_id}`, `/*` for a mounted app (the UI)."""
    if isinstance(route, Mount):
        return (route.path or "") + "/*"
    return getattr(route, "path", None) or "unmatched"


def started_response_error(exc: Exception) -> BaseException:
    """The error that cut a response off once it had begun: Starlette wraps an error it has a handler for
    (e.g. a stream's `key_revoked`) in a RuntimeError "Caught handled exception, but response already
    started", which would be logged and counted as an internal error (500) instead."""
    cause = exc.__cause__
    if isinstance(exc, RuntimeError) and cause is not None and "response already started" in str(exc):
        return cause
    return exc
