"""Waiting for tickets from the event loop, and audio / server-sent-event responses fed by audio streams.

Whether a stream's audio was saved: the SSE stream's final event says (`saved`, `output_id`, and
`storage_error` when it was not). A raw audio stream has no end to say it in (no HTTP trailers, and bytes
after the audio would corrupt it), so its headers carry `X-Cosyserve-Storage-Warning` when the output
directory already could not take results as it began, and `GET /v1/outputs?request_id=<X-Request-Id>` lists
its output once it ended, or nothing when it was not saved (counted as `storage_error`, logged with the
request id).

An SSE stream whose request waits behind others begins at once (`open_unless_queued`) and sends a
`queued` event (`{"type": "queued", "position", "ahead", "eta_s"}`, with `event: queued`) when its place
changes and about every `QUEUED_EVERY_S` while it waits; errors from then on are its `error` event. Its
headers then lack `X-Cosyserve-Seed` and the storage warning (the final event has `seed` and `saved`). Raw
audio streams wait for the start.

A client that disconnects cancels its work: while a ticket waits or runs, the connection is checked every
`POLL_S`; once a streaming response has started, Starlette notices the disconnect and closes our body
generator, which cancels the stream's ticket.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.requests import ClientDisconnect

from cosyserve.api.errors import classify, error_response, mark_counted
from cosyserve.errors import Cancelled
from cosyserve.service.backend import AudioStream
from cosyserve.service.outcomes import StreamStart, TtsOutcome
from cosyserve.service.scheduling.scheduler import Ticket

T = TypeVar("T")

log = logging.getLogger(__name__)
POLL_S = 0.25
QUEUED_EVERY_S = 1.0  # a waiting SSE stream repeats its place this often (the ETA counts down)
START_GRACE_S = 0.2  # a ticket granted a free slot starts within this (a worker thread takes it at once)
DISCONNECTED = "the client disconnected"


async def await_ticket(request: Request, ticket: Ticket) -> Any:
    """The ticket's result (or its exception, re-raised); cancels it if the client goes away first."""
    gone = False
    try:
        while not await ticket.wait_async(POLL_S):
            if await request.is_disconnected():
                gone = True
                ticket.cancel(DISCONNECTED)
    except asyncio.CancelledError:  # the server gave up on this request: nobody will read the result
        ticket.cancel(DISCONNECTED)
        raise
    try:
        return await ticket.result_async()
    except BaseException as exc:
        if gone and isinstance(exc, Cancelled):  # the client hung up: a 499, not a 409 "cancelled" conflict
            raise ClientDisconnect() from None
        raise mark_counted(exc, ticket.id) from None


async def _watching(request: Request, ticket: Ticket, pending: Awaitable[T]) -> T:
    """`pending`'s result, cancelling the ticket if the client disconnects while it waits."""
    task = asyncio.ensure_future(pending)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                ticket.cancel(DISCONNECTED)
    except BaseException as exc:
        if not task.done():
            task.cancel()
        raise mark_counted(exc, ticket.id) from None


async def open_stream(request: Request, stream: AudioStream) -> StreamStart:
    """Wait until the work has checked its request and the stream has started; errors before that
    (bad input, queue timeouts, a disconnect) raise here, while an error envelope can still be sent."""
    return await _watching(request, stream.ticket, stream.open_async())


async def open_unless_queued(request: Request, stream: AudioStream) -> None:
    """`open_stream`, unless the ticket is still queued after `START_GRACE_S` (it waits behind other work):
    then the response may begin before the start (`sse_response` reports the ticket's place meanwhile).
    A request that gets the engine at once is opened as before, so its errors stay JSON errors."""
    if await stream.ticket.wait_started_async(START_GRACE_S):
        await open_stream(request, stream)


async def _queued_events(ticket: Ticket) -> AsyncIterator[bytes]:
    """`queued` events while the ticket waits for its slot: at once, when its place changes, and every
    `QUEUED_EVERY_S` (its estimate counting down; a silent stream would look stuck)."""
    loop = asyncio.get_running_loop()
    sent_position, sent_at = None, 0.0
    while ticket.state == "queued":
        position = ticket.position
        if position is None:  # left the queue between the two reads
            break
        if position != sent_position or loop.time() - sent_at >= QUEUED_EVERY_S:
            eta = round(ticket.estimated_wait_s(), 1)
            yield _event({"type": "queued", "position": position, "ahead": position, "eta_s": eta}, "queued")
            sent_position, sent_at = position, loop.time()
        await ticket.wait_started_async(POLL_S)


class AudioStreamingResponse(StreamingResponse):
    """A streaming response that cancels its stream however it ends: done, disconnected, or never sent
    (a body generator that never started would not run its own cleanup)."""

    def __init__(self, stream: AudioStream, body: AsyncIterator[bytes], **kwargs: Any):
        super().__init__(body, **kwargs)
        self.stream = stream

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.stream.ticket.finished:
                self.stream.ticket.cancel(DISCONNECTED)
            with contextlib.suppress(Exception):  # the work's error was logged by the scheduler
                await self.stream.aclose()


def audio_stream_response(stream: AudioStream) -> StreamingResponse:
    """The audio as it is made; `open_stream` first (its start gives the headers)."""
    ticket, start = stream.ticket, _started(stream)

    async def body() -> AsyncIterator[bytes]:
        try:
            async for data in stream.achunks():
                yield data
        except Exception as exc:
            if exc is ticket.error:
                mark_counted(exc, ticket.id)  # the scheduler logged it; the middleware cuts the body off
            raise

    headers = {
        "X-Cosyserve-Seed": str(start.seed),
        "X-Cosyserve-Sample-Rate": str(start.sample_rate),
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",  # nginx: pass chunks on at once
        **_storage_headers(start),
    }
    return AudioStreamingResponse(stream, body(), media_type=start.media_type, headers=headers)


def sse_response(stream: AudioStream, input_chars: int) -> StreamingResponse:
    """OpenAI's speech SSE: `speech.audio.delta` events with base64 audio, then `speech.audio.done`;
    `queued` events first when `open_unless_queued` left the stream waiting in the queue."""
    ticket, start = stream.ticket, stream.start

    async def body() -> AsyncIterator[bytes]:
        try:
            if stream.start is None:
                async for event in _queued_events(ticket):
                    yield event
                await stream.open_async()
            async for data in stream.achunks():
                if data:
                    yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
            outcome = stream.outcome
            tokens = outcome.speech_tokens if outcome else 0
            usage = {
                "input_tokens": input_chars,
                "output_tokens": tokens,
                "total_tokens": input_chars + tokens,
            }
            done = {"type": "speech.audio.done", "usage": usage}
            if outcome is not None:
                done.update(seed=outcome.seed, output_id=outcome.output_id, duration_s=outcome.duration_s)
                done["saved"] = outcome.output_id is not None
                if outcome.storage_error:
                    done["storage_error"] = outcome.storage_error
            yield _event(done)
        except Exception as exc:
            status, code = classify(exc)
            response = error_response(mark_counted(exc, ticket.id) if exc is ticket.error else exc)
            error = json.loads(bytes(response.body))["error"]
            yield _event({"type": "error", "error": {**error, "status": status, "code": code}})

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    if start is not None:  # known only when the stream started before the response
        headers.update({"X-Cosyserve-Seed": str(start.seed), **_storage_headers(start)})
    return AudioStreamingResponse(stream, body(), media_type="text/event-stream", headers=headers)


def _storage_headers(start: StreamStart) -> dict[str, str]:
    """Known before the first byte: the output directory could not take results as the stream began."""
    if not start.storage_warning:
        return {}
    return {"X-Cosyserve-Storage-Warning": start.storage_warning.encode("ascii", "replace").decode()}


def _started(stream: AudioStream) -> StreamStart:
    if stream.start is None:
        raise RuntimeError("open_stream() the stream before answering with it")
    return stream.start


def _event(data: dict[str, Any], name: str | None = None) -> bytes:
    """One SSE event; `name` adds an `event:` line (for EventSource listeners)."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def audio_response(outcome: TtsOutcome) -> Response:
    headers = {
        "X-Cosyserve-Seed": str(outcome.seed),
        "X-Cosyserve-Duration": f"{outcome.duration_s:.3f}",
    }
    if outcome.output_id:
        headers["X-Cosyserve-Output-Id"] = outcome.output_id
    if outcome.warnings:
        headers["X-Cosyserve-Warnings"] = str(len(outcome.warnings))
    if outcome.quality is not None:  # the kept take's scores (`service.quality`)
        headers.update(outcome.quality.headers())
    if outcome.storage_error:  # the audio is here, but it was not kept: no output id, no later download
        headers["X-Cosyserve-Saved"] = "false"
        headers["X-Cosyserve-Storage-Error"] = outcome.storage_error.encode("ascii", "replace").decode()
    return Response(outcome.audio or b"", media_type=outcome.media_type, headers=headers)
