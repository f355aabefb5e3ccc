"""Waiting for tickets from the event loop, and audio / server-sent-event responses fed by them.

A client that disconnects cancels its work: while a ticket waits or runs, the connection is checked every
`POLL_S`; once a streaming response has started, Starlette notices the disconnect and closes our body
generator, which cancels the ticket.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from cosyserve.api.errors import classify, error_response, mark_counted
from cosyserve.service.requests import StreamStart, TtsOutcome
from cosyserve.service.scheduling.scheduler import Ticket

log = logging.getLogger(__name__)
POLL_S = 0.25
DISCONNECTED = "the client disconnected"


async def await_ticket(request: Request, ticket: Ticket) -> Any:
    """The ticket's result (or its exception, re-raised); cancels it if the client goes away first."""
    try:
        while not await ticket.wait_async(POLL_S):
            if await request.is_disconnected():
                ticket.cancel(DISCONNECTED)
    except asyncio.CancelledError:  # the server gave up on this request: nobody will read the result
        ticket.cancel(DISCONNECTED)
        raise
    try:
        return await ticket.result_async()
    except BaseException as exc:
        raise mark_counted(exc, ticket.id) from None


async def _first_item(request: Request, items: AsyncIterator[Any], ticket: Ticket) -> Any:
    task = asyncio.ensure_future(items.__anext__())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                ticket.cancel(DISCONNECTED)
    except StopAsyncIteration:
        raise RuntimeError(f"job {ticket.id} ended without output") from None
    except BaseException as exc:
        if not task.done():
            task.cancel()
        raise mark_counted(exc, ticket.id) from None


async def open_stream(request: Request, ticket: Ticket) -> tuple[StreamStart, AsyncIterator[Any]]:
    """Wait until the work has checked its request and produced `StreamStart`; errors before that
    (bad input, queue timeouts, a disconnect) raise here, while an error envelope can still be sent."""
    items = ticket.achunks()
    start = await _first_item(request, items, ticket)
    if not isinstance(start, StreamStart):  # pragma: no cover - the work always yields it first
        raise RuntimeError("the stream did not start with StreamStart")
    return start, items


class TicketStreamingResponse(StreamingResponse):
    """A streaming response that cancels its ticket however it ends: done, disconnected, or never sent
    (a body generator that never started would not run its own cleanup)."""

    def __init__(self, ticket: Ticket, items: AsyncIterator[Any], body: AsyncIterator[bytes], **kwargs: Any):
        super().__init__(body, **kwargs)
        self.ticket, self.items = ticket, items

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.ticket.finished:
                self.ticket.cancel(DISCONNECTED)
            aclose = getattr(self.items, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):  # the work's error was logged by the scheduler
                    await aclose()


def audio_stream_response(ticket: Ticket, start: StreamStart, items: AsyncIterator[Any]) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        try:
            async for item in items:
                if isinstance(item, bytes):
                    yield item
        except Exception as exc:
            if exc is ticket.error:
                mark_counted(exc, ticket.id)  # the scheduler logged it; the middleware cuts the body off
            raise

    headers = {
        "X-Cosyserve-Seed": str(start.seed),
        "X-Cosyserve-Sample-Rate": str(start.sample_rate),
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",  # nginx: pass chunks on at once
    }
    return TicketStreamingResponse(ticket, items, body(), media_type=start.media_type, headers=headers)


def sse_response(
    ticket: Ticket, start: StreamStart, items: AsyncIterator[Any], input_chars: int
) -> StreamingResponse:
    """OpenAI's speech SSE: `speech.audio.delta` events with base64 audio, then `speech.audio.done`."""

    async def body() -> AsyncIterator[bytes]:
        try:
            async for item in items:
                if isinstance(item, bytes) and item:
                    yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(item).decode()})
            outcome: TtsOutcome = ticket.value
            tokens = outcome.speech_tokens if outcome else 0
            usage = {
                "input_tokens": input_chars,
                "output_tokens": tokens,
                "total_tokens": input_chars + tokens,
            }
            done = {"type": "speech.audio.done", "usage": usage}
            if outcome is not None:
                done.update(seed=outcome.seed, output_id=outcome.output_id, duration_s=outcome.duration_s)
            yield _event(done)
        except Exception as exc:
            status, code = classify(exc)
            response = error_response(mark_counted(exc, ticket.id) if exc is ticket.error else exc)
            error = json.loads(bytes(response.body))["error"]
            yield _event({"type": "error", "error": {**error, "status": status, "code": code}})

    headers = {"X-Cosyserve-Seed": str(start.seed), "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return TicketStreamingResponse(ticket, items, body(), media_type="text/event-stream", headers=headers)


def _event(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def audio_response(outcome: TtsOutcome) -> Response:
    headers = {
        "X-Cosyserve-Seed": str(outcome.seed),
        "X-Cosyserve-Duration": f"{outcome.duration_s:.3f}",
    }
    if outcome.output_id:
        headers["X-Cosyserve-Output-Id"] = outcome.output_id
    if outcome.warnings:
        headers["X-Cosyserve-Warnings"] = str(len(outcome.warnings))
    return Response(outcome.audio or b"", media_type=outcome.media_type, headers=headers)
