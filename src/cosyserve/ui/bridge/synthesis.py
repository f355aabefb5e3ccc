"""Synthesis for the UI: one request queued or streamed (the scheduler's `Ticket` or an `AudioStream`), a
text over the interactive limit as an ordinary job, and cancelling either; each as the signed-in principal,
whose rate limit and daily quota apply as they do for the API."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from cosyserve.errors import CosyServeError
from cosyserve.service.access import voice_rules
from cosyserve.service.access.principals import Principal
from cosyserve.service.assembly import Service
from cosyserve.service.backend import JOB_TEXT_FACTOR, AudioStream
from cosyserve.service.quality import MAX_TAKES
from cosyserve.service.requests import OutputSpec, SynthesisRequest
from cosyserve.service.scheduling.scheduler import Ticket
from cosyserve.service.stores.jobs import JobRecord


class SynthesisPart:
    """The UI bridge's part that makes audio."""

    service: Service

    @property
    def max_text_chars(self) -> int:
        return self.service.settings.limits.max_text_chars

    @property
    def max_job_chars(self) -> int:
        return self.max_text_chars * JOB_TEXT_FACTOR

    @property
    def default_takes(self) -> int:
        """The server's takes per synthesis (`quality_takes`): the Takes input's starting value."""
        return self.service.settings.quality.takes

    max_takes = MAX_TAKES

    def submit(
        self,
        principal: Principal,
        request: SynthesisRequest,
        *,
        mode: str,
        request_id: str,
        fmt: str = "wav",
        consent: bool = False,
    ) -> Ticket:
        """Queue one synthesis as `principal` (QueueFull, ModelNotReady, RateLimited, InputError, and
        ConsentRequired for a recording whose consent a user key did not confirm: `consent`, the box)."""
        spec = self._spec(principal, request, "wav", mode, request_id, fmt, consent)
        return self.service.backend.submit_tts(request, spec)

    def stream(
        self,
        principal: Principal,
        request: SynthesisRequest,
        *,
        mode: str,
        request_id: str,
        fmt: str = "wav",
        consent: bool = False,
    ) -> AudioStream:
        """The same as `submit`, read while it is made (raw 16-bit PCM, which the page plays as it comes)."""
        spec = self._spec(principal, request, "pcm", mode, request_id, fmt, consent)
        return self.service.backend.stream_tts(request, spec)

    def _spec(
        self,
        principal: Principal,
        request: SynthesisRequest,
        delivered: str,
        mode: str,
        request_id: str,
        fmt: str,
        consent: bool,
    ) -> OutputSpec:
        access = self.service.access
        access.check_rate(principal)
        access.check_quota(principal)
        extra: dict[str, Any] = {"ui_mode": mode, "ui_format": fmt}
        if request.prompt_wav is not None:  # a recording cloned without saving a voice: as in the API
            record = voice_rules.recording_consent(principal, self.service.settings.auth, consent=consent)
            if record is not None:
                extra["consent"] = record  # kept in the output's manifest
        return OutputSpec(
            format=delivered,
            owner=principal.owner,
            key=principal.key,
            request_id=request_id,
            endpoint="ui",
            extra=extra,
        )

    def submit_job(
        self,
        principal: Principal,
        request: SynthesisRequest,
        *,
        mode: str,
        request_id: str,
        consent: bool = False,
    ) -> str:
        """A text over the interactive limit as an ordinary job (the same as POST /v1/jobs); its id."""
        spec = self._spec(principal, request, "wav", mode, request_id, "wav", consent)
        return self.service.backend.submit_job(request, dataclasses.replace(spec, endpoint="ui-job")).id

    def job(self, job_id: str) -> tuple[JobRecord | None, Ticket | None]:
        """The job's record and, while this process runs it, its ticket (progress, finished pieces)."""
        return self.service.jobs.get(job_id), self.service.scheduler.get(job_id)

    def cancel_job(self, job_id: str) -> None:
        with contextlib.suppress(CosyServeError):  # it ended meanwhile: the poller reports how
            self.service.backend.cancel_job(job_id)

    def mean_duration_s(self) -> float | None:
        return self.service.scheduler.stats().get("mean_duration_s")

    def queue_wait_estimate(self, ticket: Ticket) -> float:
        """Seconds until a queued ticket is expected to start (the scheduler's fair-queue estimate)."""
        return ticket.estimated_wait_s()

    def cancel(self, ticket: Ticket) -> None:
        if not ticket.finished:
            ticket.cancel("cancelled in the web UI")
