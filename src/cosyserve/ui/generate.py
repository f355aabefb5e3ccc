"""Running one synthesis for the UI: build the request, submit it, follow it, and say what went wrong.

Every failure reaches the page as a short message in the user's language (`as_gr_error`): input problems
with the service's own explanation, busy/not-ready/expired-login cases with a translated sentence, and
anything unexpected as "something went wrong (request id …)" while the details go to the log.
"""

from __future__ import annotations

import base64
import html
import shutil
import tempfile
import threading
import time
import unicodedata
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from cosyserve.errors import Cancelled, CosyServeError, JobTimeout, ModelNotReady, QueueFull
from cosyserve.service.access.principals import AuthRequired, Forbidden, RateLimited
from cosyserve.service.backend import AudioStream
from cosyserve.service.logs import log_failure, new_request_id
from cosyserve.service.requests import MAX_SEED, SynthesisRequest, TtsOutcome
from cosyserve.service.scheduling.scheduler import Ticket
from cosyserve.service.stores.outputs import StoredOutput
from cosyserve.ui.bridge import DOWNLOAD_FORMATS, UiBridge, UploadRefused
from cosyserve.ui.i18n import text

POLL_S = 0.25
STREAM_ITEM_TIMEOUT_S = 600.0


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
            return text("err_bad_file", lang, suffix=p.suffix)
        return text("err_big_file", lang, size=p.size_mb, limit=p.limit_mb)
    if isinstance(exc, QueueFull):
        return text("err_queue_full", lang, seconds=exc.retry_after_s)
    if isinstance(exc, ModelNotReady):
        return text("err_not_ready", lang)
    if isinstance(exc, AuthRequired):
        return text("err_auth", lang)
    if isinstance(exc, Forbidden):
        return text("err_admin", lang)
    if isinstance(exc, RateLimited):
        return text("err_rate", lang, message=str(exc))
    if isinstance(exc, JobTimeout):
        return text("err_timeout", lang, message=str(exc))
    if isinstance(exc, Cancelled):
        return text("cancelled", lang)
    if isinstance(exc, CosyServeError):
        return str(exc)
    return text("err_internal", lang, request_id=request_id or "-")


def as_gr_error(exc: BaseException, lang: str, request_id: str | None = None) -> gr.Error:
    """A Gradio error modal for `exc`; unexpected exceptions are logged with their traceback first."""
    if isinstance(exc, gr.Error):
        return exc
    if not isinstance(exc, (UiError, CosyServeError)):
        log_failure("ui", f"web UI request {request_id} failed: {exc}", exc=exc)
    message = html.escape(error_message(exc, lang, request_id))
    return gr.Error(message, title=text("error_title", lang), print_exception=False)


@dataclass
class Form:
    """The synthesis inputs of one mode tab, as the page sends them."""

    mode: str  # zero_shot, cross_lingual or instruct
    voice: str | None = None  # saved voice id ("" or None: use the recording)
    prompt: str | None = None  # uploaded/recorded file path
    transcript: str | None = None
    preset: str | None = None
    instruct: str | None = None
    text: str = ""
    seed: str | None = None  # digits, or empty for a random one
    speed: float = 1.0
    volume: float = 1.0
    fmt: str = "wav"
    stream: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def build_request(bridge: UiBridge, form: Form) -> SynthesisRequest:
    """The service request for a form; UiError for what the UI can tell is missing or too long."""
    spoken = unicodedata.normalize("NFC", form.text or "").strip()
    if not spoken:
        raise UiError("err_no_text")
    limit = bridge.max_text_chars
    if len(spoken) > limit:
        raise UiError("err_too_long", count=len(spoken), limit=limit)
    seed = None
    seed_text = str(form.seed if form.seed is not None else "").strip()
    if seed_text:
        if not seed_text.isdigit() or int(seed_text) > MAX_SEED:
            raise UiError("err_seed", limit=MAX_SEED)
        seed = int(seed_text)
    transcript = (form.transcript or "").strip() or None
    instruct = (form.instruct or "").strip() or (form.preset or "").strip() or None
    common: dict[str, Any] = {
        "text": form.text,
        "seed": seed,
        "speed": float(form.speed),
        "volume": float(form.volume),
    }
    if form.mode == "instruct" and instruct is None:
        raise UiError("err_no_instruct")
    if form.voice:
        voice = bridge.voice(form.voice)
        if form.mode == "zero_shot":
            if transcript is None and not voice.transcript:
                raise UiError("err_no_transcript")
            return SynthesisRequest(voice=voice.id, prompt_text=transcript, instruct="", **common)
        if form.mode == "cross_lingual":  # "" overrides the voice's transcript and default instruction
            return SynthesisRequest(voice=voice.id, prompt_text="", instruct="", **common)
        return SynthesisRequest(voice=voice.id, instruct=instruct, **common)
    if not form.prompt:
        raise UiError("err_no_prompt")
    if form.mode == "zero_shot" and transcript is None:
        raise UiError("err_no_transcript")
    bridge.check_prompt(form.prompt)  # fails fast, before a queue slot is taken
    audio, _ = bridge.read_upload(form.prompt)
    return SynthesisRequest(
        prompt_wav=audio,
        prompt_text=transcript if form.mode == "zero_shot" else None,
        instruct=instruct if form.mode == "instruct" else None,
        **common,
    )


class TicketRegistry:
    """Running UI tickets by browser session, so the Cancel button can stop them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tickets: dict[str, set[Ticket]] = {}

    def add(self, session: str, ticket: Ticket) -> None:
        with self._lock:
            self._tickets.setdefault(session, set()).add(ticket)

    def remove(self, session: str, ticket: Ticket) -> None:
        with self._lock:
            tickets = self._tickets.get(session)
            if tickets is not None:
                tickets.discard(ticket)
                if not tickets:
                    del self._tickets[session]

    def cancel(self, session: str) -> int:
        with self._lock:
            tickets = list(self._tickets.get(session, ()))
        for ticket in tickets:
            if not ticket.finished:
                ticket.cancel("cancelled in the web UI")
        return len(tickets)


def cache_copy(path: str | Path, cache_dir: str) -> str:
    """A copy of a stored file in Gradio's cache (a fresh random folder), which is what the page may load:
    the output store itself is never exposed by path."""
    folder = Path(cache_dir) / f"cosy-{uuid.uuid4().hex}"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / Path(path).name
    shutil.copyfile(path, target)
    return str(target)


def links_html(bridge: UiBridge, output: StoredOutput, lang: str, chosen: str = "wav") -> str:
    """Signed download links to the output store, the chosen format first."""
    formats = [chosen] + [f for f in DOWNLOAD_FORMATS if f != chosen]
    parts = []
    for fmt in formats:
        url = html.escape(bridge.download_url(output, fmt), quote=True)
        title = html.escape(text("download", lang, fmt=fmt.upper()), quote=True)
        parts.append(
            f'<a class="cosy-download" data-format="{fmt}" href="{url}" title="{title}" '
            f'download="{output.id}.{fmt}">⬇ {fmt.upper()}</a>'
        )
    return f'<div class="cosy-links">{"".join(parts)}</div>'


def result_info(outcome: TtsOutcome, lang: str, elapsed: float) -> str:
    info = text("result_info", lang, seed=outcome.seed, duration=outcome.duration_s, elapsed=elapsed)
    warnings = "".join(f"\n- ⚠️ {html.escape(w)}" for w in outcome.warnings)
    return info + (("\n" + warnings) if warnings else "")


def run_synthesis(
    bridge: UiBridge,
    registry: TicketRegistry,
    form: Form,
    lang: str,
    request: Any,
    progress: Any,
    cache_dir: str | None = None,
) -> Iterator[tuple[Any, Any, Any, Any]]:
    """Yield (result audio, download links, info, stream box) updates for one Generate click."""
    request_id = new_request_id()
    started = time.monotonic()
    try:
        principal = bridge.principal_of(request)
        synthesis = build_request(bridge, form)
        stream = None
        if form.stream:
            stream = bridge.stream(principal, synthesis, mode=form.mode, request_id=request_id, fmt=form.fmt)
            ticket = stream.ticket
        else:
            ticket = bridge.submit(principal, synthesis, mode=form.mode, request_id=request_id, fmt=form.fmt)
    except Exception as exc:
        raise as_gr_error(exc, lang, request_id) from None
    session = getattr(request, "session_hash", None) or request_id
    registry.add(session, ticket)
    try:
        if stream is not None:
            outcome = yield from _follow_stream(bridge, stream, lang, progress)
        else:
            outcome = _follow(bridge, ticket, lang, progress)
    except Cancelled:
        yield gr.update(), gr.update(), text("cancelled", lang), gr.update()
        return
    except Exception as exc:
        raise as_gr_error(exc, lang, request_id) from None
    finally:
        registry.remove(session, ticket)
        bridge.cancel(ticket)  # no-op once finished; stops the work if the page went away
    elapsed = time.monotonic() - started
    info = result_info(outcome, lang, elapsed)
    if outcome.output_id is None:  # storing failed (logged by the service): nothing to show or download
        yield None, "", info, gr.update()
        return
    output = bridge.service.outputs.get(outcome.output_id)
    audio = cache_copy(output.path, cache_dir or tempfile.gettempdir())
    yield audio, links_html(bridge, output, lang, form.fmt), info, gr.update()


def _follow(bridge: UiBridge, ticket: Ticket, lang: str, progress: Any) -> TtsOutcome:
    mean = bridge.mean_duration_s() or 5.0
    while not ticket.wait(POLL_S):
        if ticket.state == "queued":
            position = ticket.position
            progress(0.0, desc=text("queued", lang, position=(position or 0)))
        elif ticket.started_at is not None:
            running = time.time() - ticket.started_at
            progress(min(0.95, running / mean), desc=text("generating", lang))
    return ticket.result()


def _follow_stream(bridge: UiBridge, stream: AudioStream, lang: str, progress: Any) -> Iterator[Any]:
    """Yield stream-box updates while the audio arrives; returns the outcome."""
    run = uuid.uuid4().hex[:12]
    mean = bridge.mean_duration_s() or 5.0
    samples = 0
    progress(0.0, desc=text("generating", lang))
    rate = stream.open(timeout=STREAM_ITEM_TIMEOUT_S).sample_rate
    box = f"{run}:{rate}"
    yield None, "", text("generating", lang), box
    for data in stream.chunks():
        if not data:
            continue
        samples += len(data) // 2
        box += "|" + base64.b64encode(data).decode("ascii")
        seconds = samples / rate
        running = time.time() - (stream.ticket.started_at or time.time())
        progress(min(0.95, running / mean), desc=text("streaming", lang, seconds=seconds))
        yield gr.update(), gr.update(), text("streaming", lang, seconds=seconds), box
    outcome: TtsOutcome = stream.ticket.result()
    yield gr.update(), gr.update(), gr.update(), box + "|END"
    return outcome
