"""Where synthesis runs: the `Backend` protocol, which the service chooses once from its role.

`local.LocalBackend` runs work in this process on the model its `ModelHost` holds (a single server, or a
`cosyserve worker`); `distributed.remote.RemoteBackend` hands work to workers through a shared queue (an
API node). Callers (the API, the web UI, the worker's task handlers) see only this protocol. The checks
both backends make before accepting work are here too, so they cannot drift apart.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol

from cosyserve.errors import InputError, JobStateError, TextError
from cosyserve.frontend.prompt_check import load_prompt
from cosyserve.frontend.text.prepare import check_inline_instruction, quoted
from cosyserve.frontend.text.prompts import inline_instruction
from cosyserve.frontend.text.split import has_content, require_visible_text, split_long_text
from cosyserve.frontend.text.tags import nfc
from cosyserve.frontend.tokenizer import ENDOFPROMPT
from cosyserve.service.batches.submission import BatchSubmission
from cosyserve.service.outcomes import StreamStart, TtsOutcome
from cosyserve.service.quality.overrides import checked_against
from cosyserve.service.quality.scores import QualityThresholds
from cosyserve.service.requests import EnrolmentRequest, OutputSpec, SynthesisRequest
from cosyserve.service.scheduling.tickets import Ticket
from cosyserve.service.stores.jobs import JobNotFound, JobRecord, JobStore

JOB_TEXT_FACTOR = 50  # a job may carry this many times max_text_chars; it is synthesised piece by piece


class AudioStream:
    """A streamed synthesis as its reader sees it: `start` once the request was checked (seed, media type,
    rate: a response can begin), then the encoded audio (`chunks`), then the `outcome`.

    It reads a streaming ticket whose work yields a `StreamStart` first, then bytes, and returns the
    `TtsOutcome` (the stream work of both backends does). One reader, from a thread (`open`, `chunks`) or
    an event loop (`open_async`, `achunks`); errors before the start are raised by `open`, later ones after
    the last chunk; a reader that stops early cancels the work.
    """

    def __init__(self, ticket: Ticket) -> None:
        if not ticket.stream:
            raise TypeError(f"job {ticket.id} was not submitted as a stream")
        self.ticket = ticket
        self.start: StreamStart | None = None
        self._items: Iterator[Any] | None = None
        self._aitems: AsyncIterator[Any] | None = None

    def open(self, timeout: float | None = None) -> StreamStart:
        """Wait for the start (each item waits at most `timeout` seconds)."""
        self._items = self.ticket.chunks(timeout)
        return self._started(next(self._items, None))

    def chunks(self) -> Iterator[bytes]:
        """The encoded audio as it is made, after `open`."""
        if self._items is None:
            raise RuntimeError("open() the stream before reading its chunks")
        return self._items

    async def open_async(self, timeout: float | None = None) -> StreamStart:
        self._aitems = self.ticket.achunks(timeout)
        try:
            first = await self._aitems.__anext__()
        except StopAsyncIteration:
            first = None
        return self._started(first)

    def achunks(self) -> AsyncIterator[bytes]:
        if self._aitems is None:
            raise RuntimeError("open_async() the stream before reading its chunks")
        return self._aitems

    async def aclose(self) -> None:
        """Stop reading (cancels the work unless it finished)."""
        close = getattr(self._aitems, "aclose", None)
        if close is not None:
            await close()

    @property
    def outcome(self) -> TtsOutcome | None:
        """The outcome once the last chunk was read (None if the work did not succeed)."""
        return self.ticket.value

    def _started(self, first: object) -> StreamStart:
        if not isinstance(first, StreamStart):  # a stream work that ended without a start broke its contract
            raise RuntimeError(f"job {self.ticket.id} ended without starting its stream")
        self.start = first
        return first


class Backend(Protocol):
    """Synthesis, jobs and voice enrolment, wherever they run."""

    @property
    def model_info(self) -> dict[str, Any]:
        """What is known about the model that serves requests (sample_rate once it is known)."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def readiness(self, detailed: bool, *, accepting: bool) -> dict[str, Any]:
        """{"ready", "state", "reason", model info...}; `accepting`: the scheduler still takes work."""
        ...

    def require_ready(self) -> None:
        """Raise (ModelNotReady, NoWorkers, ...) unless work can be accepted now."""
        ...

    def restart_engine(self) -> str:
        """Reload the model; returns the new state (InputError where there is no model to restart)."""
        ...

    def submit_tts(self, request: SynthesisRequest, spec: OutputSpec) -> Ticket:
        """Queue one synthesis; its ticket's result is a `TtsOutcome` with the encoded audio."""
        ...

    def stream_tts(self, request: SynthesisRequest, spec: OutputSpec) -> AudioStream:
        """Queue one synthesis whose audio is read while it is made."""
        ...

    def submit_job(self, request: SynthesisRequest, spec: OutputSpec) -> JobRecord:
        """Accept a (possibly long) text as a job; its record always ends done, failed or cancelled."""
        ...

    def submit_batch(self, batch: BatchSubmission, spec: OutputSpec) -> JobRecord:
        """Accept a batch ("batch") or a dub ("dub") of checked items as one job; its items end one by one."""
        ...

    def cancel_job(self, job_id: str) -> JobRecord:
        """Cancel a queued or running job (JobNotFound, or JobStateError if it already ended)."""
        ...

    def submit_enrolment(self, enrolment: EnrolmentRequest, *, request_id: str | None = None) -> Ticket:
        """Analyse and store a new voice; its ticket's result is the `Voice`."""
        ...


def admitted_job_pieces(
    request: SynthesisRequest, max_chars: int, thresholds: QualityThresholds | None = None
) -> list[str]:
    """`job_pieces` at submit, after every check `/v1/tts` would refuse the request for without the model
    (InputError): no voice or recording (or both), a value out of range, thresholds that leave no pace
    range over the server's `thresholds`, a recording that cannot be decoded or used. So the job is
    refused then, rather than failing once it runs."""
    request.check_fields()
    checked_against(thresholds or QualityThresholds(), request.thresholds)
    pieces = job_pieces(request, max_chars)
    if request.prompt_wav is not None:
        load_prompt(request.prompt_wav)  # last: decoding is the costliest check
    return pieces


def job_pieces(request: SynthesisRequest, max_chars: int) -> list[str]:
    """The pieces a job's text is synthesised in (InputError for a text that is too long, or that has
    nothing to speak: refused at submit, as /v1/tts refuses it)."""
    require_visible_text(request.text)
    limit = max_chars * JOB_TEXT_FACTOR
    text = nfc(request.text).strip()  # counted as /v1/tts counts (`check_length`): composed, unpadded
    if len(text) > limit:
        raise InputError(f"a job text may have at most {limit} characters, got {len(text)}")
    # An instruction before <|endofprompt|> holds for the whole text: each piece carries it (cut with the
    # text, it went to the first piece only, unchecked for its length)
    inline, body = inline_instruction(text) if ENDOFPROMPT in text else (None, text)
    check_inline_instruction(inline)
    pieces = split_long_text(body, max_chars)
    if inline is not None:
        pieces = [f"{inline}{ENDOFPROMPT}{piece}" for piece in pieces]
    if not pieces or not any(has_content(piece) for piece in pieces):
        raise TextError(
            f"the text {quoted(request.text)} has nothing to speak (only punctuation or blanks): "
            "give words to read"
        )
    return pieces


def cancellable_job(jobs: JobStore, job_id: str) -> JobRecord:
    """The record of a job that can still be cancelled; JobNotFound or JobStateError otherwise."""
    record = jobs.get(job_id)
    if record is None:
        raise JobNotFound(f"no job {job_id!r}: list your jobs with GET /v1/jobs")
    if record.is_terminal:
        what = {"batch": "batch", "dub": "dub"}.get(record.kind, "job")
        raise JobStateError(
            f"{what} {job_id} already ended ({record.state}): only one still queued or running can be "
            "cancelled"
        )
    return record


def new_job_id() -> str:
    return uuid.uuid4().hex
