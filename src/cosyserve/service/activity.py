"""One structured log line per thing a person asked for: a synthesis, a job, an enrolment, a restart, a
login. From these lines alone an operator answers what ran, for whom, how fast and on which device.

Each line comes from the `cosyserve.activity` logger at INFO with the same fields (text lines show them as
`key=value`, JSON lines as keys): `event`, `result` (ok, or the error code, or cancelled), `who` (the API
key's name, the UI user, or anonymous), `mode`, `chars`, `audio_s`, `rtf` (run seconds per audio second),
`wait_s`, `run_s`, `device`, `endpoint`, and the request id every log line carries. Work on the scheduler
is logged by a ticket `on_state` callback, so a request that was cancelled while queued, timed out or
failed gets its line too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from cosyserve.errors import Interrupted, ShuttingDown, error_code
from cosyserve.service.requests import TERMINAL_STATES, OutputSpec, SynthesisRequest
from cosyserve.service.scheduling.tickets import Ticket, ended_as

log = logging.getLogger("cosyserve.activity")
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
OnState = Callable[[Ticket, str], None]


def log_activity(event: str, result: str, *, request_id: str | None = None, **fields: Any) -> None:
    """The line: `"<event> <result>"` plus the fields (None values left out)."""
    extra = {"event": event, "result": result}
    for key, value in fields.items():
        if value is not None:
            extra[f"{key}_" if key in _RECORD_ATTRS else key] = value
    if request_id:
        extra["request_id"] = request_id
    log.info("%s %s", event, result, extra=extra)


def who(spec: OutputSpec | None = None, *, owner: str | None = None, key_name: str | None = None) -> str:
    """The caller as an operator recognises it: the API key's name, else the owner tag, else anonymous."""
    if spec is not None:
        key_name = key_name or (spec.key.name if spec.key is not None else None)
        owner = owner or spec.owner
    return key_name or owner or "anonymous"


def request_mode(request: SynthesisRequest, spec: OutputSpec) -> str:
    """zero_shot, cross_lingual, instruct or voice (a saved voice with its own defaults), or the UI's mode."""
    ui_mode = spec.extra.get("ui_mode")
    if ui_mode:
        return str(ui_mode)
    if request.instruct:
        return "instruct"
    if request.prompt_text:
        return "zero_shot"
    if request.voice is not None and request.prompt_text is None:
        return "voice"
    return "cross_lingual"


def ticket_result(ticket: Ticket) -> str:
    state, error = ended_as(ticket)
    if state == "done":
        return "ok"
    if state == "cancelled":
        return "cancelled"
    return error_code(error) if error is not None else state


def _failure(ticket: Ticket) -> str | None:
    state, error = ended_as(ticket)
    return str(error) if error is not None and state == "failed" else None


def ticket_times(ticket: Ticket) -> dict[str, float | None]:
    wait = ticket.wait_s if ticket.started_mono is not None else None
    return {"wait_s": _rounded(wait), "run_s": _rounded(ticket.run_s)}


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def synthesis_logger(
    event: str,
    request: SynthesisRequest,
    spec: OutputSpec,
    device: str | None,
    job_id: str | None = None,
    *,
    kept_queued: bool = False,
) -> OnState:
    """A ticket's `on_state` that logs the synthesis (or job) once it ends; a job the server stopped to
    run again (an engine restart; a shutdown, when `kept_queued`) is logged `requeued`, not failed."""

    def on_state(ticket: Ticket, state: str) -> None:
        if state not in TERMINAL_STATES:
            return
        if job_id is not None and (
            isinstance(ticket.error, Interrupted) or (kept_queued and isinstance(ticket.error, ShuttingDown))
        ):
            log_activity(event, "requeued", request_id=spec.request_id, who=who(spec), job_id=job_id)
            return
        outcome = ticket.value
        audio_s = round(float(outcome.duration_s), 3) if outcome is not None else None
        times = ticket_times(ticket)
        rtf = round(times["run_s"] / audio_s, 3) if audio_s and times["run_s"] is not None else None
        log_activity(
            event,
            ticket_result(ticket),
            request_id=spec.request_id,
            who=who(spec),
            mode=request_mode(request, spec),
            chars=len(request.text),
            audio_s=audio_s,
            rtf=rtf,
            **times,
            device=device,
            endpoint=spec.endpoint,
            voice=request.voice,
            job_id=job_id,
            output_id=getattr(outcome, "output_id", None),
            error=_failure(ticket),
        )

    return on_state


def enrolment_logger(
    name: str,
    request_id: str | None,
    device: str | None,
    *,
    consent: bool | None = None,
    enroller: str | None = None,
) -> OnState:
    """The `enrolment` line of one voice's enrolment: `who` enrolled it (`enroller`: who confirmed the
    consent, else the owner tag) and whether consent was given."""

    def on_state(ticket: Ticket, state: str) -> None:
        if state in TERMINAL_STATES:
            voice = ticket.value
            log_activity(
                "enrolment",
                ticket_result(ticket),
                request_id=request_id,
                voice_name=name,
                voice=getattr(voice, "id", None),
                who=enroller,
                consent=None if consent is None else ("confirmed" if consent else "none"),
                device=device,
                **ticket_times(ticket),
                error=str(ticket.error) if state == "failed" else None,
            )

    return on_state


def both(first: OnState | None, second: OnState) -> OnState:
    """Two `on_state` callbacks in order (the second runs even if the first raised)."""
    if first is None:
        return second

    def on_state(ticket: Ticket, state: str) -> None:
        try:
            first(ticket, state)
        finally:
            second(ticket, state)

    return on_state
