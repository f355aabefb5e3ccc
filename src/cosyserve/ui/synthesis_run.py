"""One Generate click: clear the last result, build the request, submit it (or a job for a long text),
follow it while the page shows progress or streams, and report how it ended, Cancel included."""

from __future__ import annotations

import base64
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import gradio as gr

from cosyserve.errors import Cancelled
from cosyserve.ui.bridge import AudioStream, Ticket, TtsOutcome, UiBridge, new_request_id
from cosyserve.ui.generate import (
    POLL_S,
    STREAM_ITEM_TIMEOUT_S,
    Form,
    Run,
    TicketRegistry,
    Update,
    as_gr_error,
    build_request,
    finished,
)
from cosyserve.ui.i18n import text
from cosyserve.ui.long_text import run_job


def run_synthesis(
    bridge: UiBridge,
    registry: TicketRegistry,
    form: Form,
    lang: str,
    request: Any,
    progress: Any,
    cache_dir: str | None = None,
    click: str = "",
) -> Iterator[Update]:
    """Yield (result audio, links, info, stream box, progress, preview) updates for one Generate click
    (`click`: its token, which a Cancel pressed while it waited in the page's queue names)."""
    request_id = new_request_id()
    session = getattr(request, "session_hash", None) or request_id
    run = registry.begin(session, click)  # before anything else: a Cancel from now on is not lost
    try:
        yield from _run(
            bridge, run, form, lang, request, progress, cache_dir or tempfile.gettempdir(), request_id
        )
    finally:
        registry.end(session, run)


def _run(
    bridge: UiBridge,
    run: Run,
    form: Form,
    lang: str,
    request: Any,
    progress: Any,
    cache_dir: str,
    request_id: str,
) -> Iterator[Update]:
    yield None, "", "", gr.update(), "", ""  # the last result goes first: nothing stale under an error
    started = time.monotonic()
    try:
        principal = bridge.principal_of(request)
        synthesis = build_request(bridge, principal, form, allow_long=True)
        run.check()
        if len(synthesis.text.strip()) > bridge.max_text_chars:
            yield from run_job(bridge, run, principal, synthesis, form, lang, cache_dir, request_id)
            return
        stream = None
        how: dict[str, Any] = {
            "mode": form.mode,
            "request_id": request_id,
            "fmt": form.fmt,
            "consent": form.consent,
        }
        if form.stream and (synthesis.takes or 1) <= 1:  # takes win: a failed take is made again unheard
            stream = bridge.stream(principal, synthesis, **how)
            ticket = stream.ticket
        else:
            ticket = bridge.submit(principal, synthesis, **how)
    except Cancelled:
        yield None, "", text("cancelled", lang), gr.update(), "", ""
        return
    except Exception as exc:
        raise as_gr_error(exc, lang, request_id) from None
    run.attach(lambda: bridge.cancel(ticket))
    try:
        if stream is not None:
            outcome = yield from _follow_stream(bridge, stream, lang, progress)
        else:
            outcome = _follow(bridge, ticket, lang, progress)
    except Cancelled:
        yield gr.update(), gr.update(), text("cancelled", lang), gr.update(), "", gr.update()
        return
    except Exception as exc:
        raise as_gr_error(exc, lang, request_id) from None
    finally:
        bridge.cancel(ticket)  # no-op once finished; stops the work if the page went away
    yield finished(
        bridge, principal, form, outcome, lang, time.monotonic() - started, cache_dir, run.cancelled
    )


def _queued_line(bridge: UiBridge, ticket: Ticket, lang: str) -> str:
    """ "Queued (N ahead, about W s)" for a ticket waiting in the service's queue."""
    wait = round(bridge.queue_wait_estimate(ticket))
    if not ticket.position:  # "0 ahead" read as "no wait" beside a wait: it is next, behind running work
        return text("queued_next", lang, wait=wait)
    return text("queued", lang, position=ticket.position, wait=wait)


def _follow(bridge: UiBridge, ticket: Ticket, lang: str, progress: Any) -> TtsOutcome:
    mean = bridge.mean_duration_s() or 5.0
    while not ticket.wait(POLL_S):
        if ticket.state == "queued":
            progress(0.0, desc=_queued_line(bridge, ticket, lang))
        elif ticket.started_at is not None:
            progress(min(0.95, ticket.running_s() / mean), desc=text("generating", lang))
    return ticket.result()


def _follow_stream(bridge: UiBridge, stream: AudioStream, lang: str, progress: Any) -> Iterator[Any]:
    """Yield stream-box updates while the audio arrives; returns the outcome."""
    run = uuid.uuid4().hex[:12]
    mean = bridge.mean_duration_s() or 5.0
    samples = 0
    shown = ""
    while stream.ticket.state == "queued":  # its place in the queue, on the player and the info line
        line = _queued_line(bridge, stream.ticket, lang)
        progress(0.0, desc=line)
        if line != shown:
            shown = line
            yield gr.update(), gr.update(), line, gr.update(), gr.update(), gr.update()
        if stream.ticket.wait(POLL_S):
            break
    progress(0.0, desc=text("generating", lang))
    rate = stream.open(timeout=STREAM_ITEM_TIMEOUT_S).sample_rate
    box = f"{run}:{rate}"
    yield None, "", text("generating", lang), box, gr.update(), gr.update()
    for data in stream.chunks():
        if not data:
            continue
        samples += len(data) // 2
        box += "|" + base64.b64encode(data).decode("ascii")
        seconds = samples / rate
        progress(min(0.95, stream.ticket.running_s() / mean), desc=text("streaming", lang, seconds=seconds))
        yield (
            gr.update(),
            gr.update(),
            text("streaming", lang, seconds=seconds),
            box,
            gr.update(),
            gr.update(),
        )
    outcome: TtsOutcome = stream.ticket.result()
    yield gr.update(), gr.update(), gr.update(), box + "|END", gr.update(), gr.update()
    return outcome
