"""The local backend: what the service runs on its own scheduler and model (a single server, a worker).

One-shot and streamed syntheses, long-text jobs (`local.long_text_jobs`) and voice enrolment, each as work
for the scheduler that borrows the synthesizer from the `ModelHost`. Every finished synthesis is stored
(WAV at the model's rate, plus its provenance manifest) and counted (audio seconds, real-time factor, the
caller's quota); formats other than WAV are encoded from it for the response, downloads can transcode
later. A streamed ticket yields a `StreamStart` first (the request was checked and the seed is known: the
response can begin), then encoded bytes as they are ready.

A synthesis for an API key checks the key again after every segment (`KeyWatch`): a stream whose key was
revoked meanwhile ends at that boundary with `key_revoked`, charged only for the segments made before.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import socket
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from cosyserve.engine.memory import out_of_memory_as_error
from cosyserve.service.access.key_watch import KeyChanged, KeyWatch, key_id_of
from cosyserve.service.access.limits import QuotaTracker
from cosyserve.service.activity import enrolment_logger, synthesis_logger
from cosyserve.service.audio_formats import StreamEncoder
from cosyserve.service.backend import AudioStream
from cosyserve.service.batches.submission import BatchSubmission
from cosyserve.service.labels.labeller import Labeller
from cosyserve.service.local.job_quota import JobQuota
from cosyserve.service.local.job_runner import LocalJobs
from cosyserve.service.local.key_guard import KeyGuard, SentAudio
from cosyserve.service.local.model_host import ModelHost
from cosyserve.service.local.recovery import JobFeeder
from cosyserve.service.local.results import Results
from cosyserve.service.logs import request_context
from cosyserve.service.metrics import Metrics
from cosyserve.service.outcomes import StreamStart, TtsOutcome
from cosyserve.service.requests import EnrolmentRequest, OutputSpec, SynthesisRequest
from cosyserve.service.reservations import QuotaReservations
from cosyserve.service.scheduling.scheduler import Scheduler, Ticket, WorkContext
from cosyserve.service.setting_groups import LimitSettings, QueueSettings
from cosyserve.service.startup_clock import StartupClock
from cosyserve.service.stores.batches import BatchStore
from cosyserve.service.stores.job_pieces import JobPieces
from cosyserve.service.stores.jobs import JobRecord, JobStore
from cosyserve.service.stores.keys import ApiKey
from cosyserve.service.stores.outputs import OutputStore
from cosyserve.service.stores.voices import Voice

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class LocalBackend:
    """Synthesis in this process: the model its host holds, run on its scheduler, results kept in the
    stores and counted."""

    host: ModelHost
    scheduler: Scheduler
    jobs: JobStore
    outputs: OutputStore
    quota: QuotaTracker  # charged for the audio each key's requests produce
    metrics: Metrics
    limits: LimitSettings
    startup: StartupClock
    recover_jobs: bool  # this process alone owns the job table: an earlier process's jobs run again
    upload_outputs: bool  # outputs go to the bucket before the answer (a worker's API node reads them there)
    batches: BatchStore  # the items of batch and dub jobs
    key_lookup: Callable[[int], ApiKey | None]  # a job's key by id (quotas of jobs run after a restart)
    queue: QueueSettings  # job timeouts, retry limit, lease
    reservations: QuotaReservations  # every synthesis and job holds its estimate of the key's quota first
    labels: Labeller = dataclasses.field(default_factory=Labeller.disabled)  # cue, stream and response labels

    # -- lifecycle and readiness ---------------------------------------------------------------------------

    @property
    def model_info(self) -> dict[str, Any]:
        return self.host.info

    def start(self) -> None:
        self.reservations.release_dead(self.jobs)
        self.host.start()
        if self.recover_jobs:
            self.feeder.start()

    def stop(self) -> None:
        if self.recover_jobs:
            self.feeder.stop()
        self.host.stop()

    def readiness(self, detailed: bool, *, accepting: bool) -> dict[str, Any]:
        return self.host.readiness(detailed, accepting=accepting)

    def require_ready(self) -> None:
        self.host.require_ready()

    def restart_engine(self) -> str:
        return self.host.restart()

    # -- synthesis -----------------------------------------------------------------------------------------

    def submit_tts(self, request: SynthesisRequest, spec: OutputSpec) -> Ticket:
        """Queue one synthesis (QueueFull, ShuttingDown, ModelNotReady, InputError for bad formats,
        QuotaExceeded when its estimate does not fit in the key's quota)."""
        self.require_ready()
        spec = spec.checked(self.model_info.get("sample_rate"))

        def work_for(spec: OutputSpec) -> Callable[[WorkContext], TtsOutcome]:
            def work(ctx: WorkContext) -> TtsOutcome:
                guard = self._guard(ctx, spec)
                guard.check_at_start()
                # a stop for its key delivers nothing, so charges nothing: the reservation goes back
                with request_context(spec.request_id), self.host.synthesizer(work=ctx) as synth:
                    stream = self.results.run_engine(
                        lambda: synth.synthesize(
                            request, progress=guard, cancel=ctx.cancel, voices=spec.voice_scope
                        )
                    )
                    guard.stream = stream
                    result = self.results.run_engine(stream.result)
                    ctx.check_cancelled()  # cancelled during the last sentence's audio: nothing is stored
                    return self.results.finish(synth, request, result, spec, encoded=True)

            return work

        return self._submit_held(request, spec, work_for, stream=False)

    def stream_tts(self, request: SynthesisRequest, spec: OutputSpec) -> AudioStream:
        """Queue one synthesis whose encoded audio is read while the engine makes it."""
        self.require_ready()
        spec = spec.checked(self.model_info.get("sample_rate"))
        request = dataclasses.replace(request, stream=True)

        def work_for(spec: OutputSpec) -> Callable[[WorkContext], Any]:
            def work(ctx: WorkContext) -> Generator[StreamStart | bytes, None, TtsOutcome]:
                return self._stream_items(ctx, request, spec)

            return work

        return AudioStream(self._submit_held(request, spec, work_for, stream=True))

    def _submit_held(
        self,
        request: SynthesisRequest,
        spec: OutputSpec,
        work_for: Callable[[OutputSpec], Callable[[WorkContext], Any]],
        *,
        stream: bool,
    ) -> Ticket:
        """Reserve the request's estimate, then queue its work; the reservation is settled by
        `Results.finish`, or given back when the ticket ends otherwise (or the queue refuses it)."""
        logged = synthesis_logger("synthesis", request, spec, self.model_info.get("device"))

        def submit(spec: OutputSpec, on_state: Any) -> Ticket:
            return self.scheduler.submit(work_for(spec), owner=spec.owner, stream=stream, on_state=on_state)

        return self.reservations.submitted(request, spec, submit, logged)

    def _stream_items(
        self, ctx: WorkContext, request: SynthesisRequest, spec: OutputSpec
    ) -> Generator[StreamStart | bytes, None, TtsOutcome]:
        """What `AudioStream` reads: the start, then encoded chunks; returns the outcome. A stream the client
        leaves early (a cancel, a hang-up) is charged for the audio it was sent (`SentAudio`)."""
        guard = self._guard(ctx, spec, stage="chunk")
        guard.check_at_start()
        oom = out_of_memory_as_error("a streamed synthesis")  # the encoder's buffers too
        with request_context(spec.request_id), self.host.synthesizer(work=ctx) as synth, oom:
            explicit = self.results.run_engine(
                lambda: self.labels.explicit_for(synth, request, spec.extra, spec.voice_scope)
            )
            stream = self.results.run_engine(
                lambda: synth.synthesize(request, progress=guard, cancel=ctx.cancel, voices=spec.voice_scope)
            )
            guard.stream = stream
            encoder = self.labels.stream_encoder(
                StreamEncoder(spec.format, spec.sample_rate, source_rate=synth.sample_rate),
                spec.request_id or "stream",
                explicit,
            )
            warning = self.outputs.health.public_problem()  # the stream's end cannot say so: its start does
            yield StreamStart(stream.seed, encoder.media_type, encoder.sample_rate, warning)
            yielded = 1
            head = encoder.header()
            if head:
                yielded += 1
                yield head
            chunks = iter(stream)
            first = True
            sent = SentAudio(synth.sample_rate, lambda: ctx.items_taken)
            settle = self.reservations.settle
            with sent.charged_if_left(settle, spec, self.metrics.count_audio):
                with guard.charging_what_was_made(settle, spec, self.metrics.count_audio):
                    while True:
                        chunk = self.results.run_engine(lambda: next(chunks, None))
                        if chunk is None:
                            break
                        if first and stream.first_audio_at is not None:
                            first = False
                            self.metrics.observe_first_chunk(stream.first_audio_at - ctx.submitted_mono)
                        guard.check_streamed(sent.samples / synth.sample_rate)
                        data = encoder.encode(chunk.samples)
                        if data:  # (an encoder may hold a little back)
                            yielded += 1
                            sent.handed(len(chunk.samples), yielded)
                            yield data
                        else:
                            sent.handed(len(chunk.samples), yielded + 1)  # goes out with the next
                tail = encoder.finish()
                if tail:
                    yield tail
                ctx.check_cancelled()
            return self.results.finish(synth, request, stream.result(), spec, encoded=False)

    def _guard(self, ctx: WorkContext, spec: OutputSpec, stage: str = "request") -> KeyGuard:
        watch = KeyWatch(self.key_lookup, spec.key.id if spec.key is not None else None)
        reservation = spec.reservation  # (its day's quota is the one that admitted it)
        return KeyGuard(
            ctx, watch, lambda key: self.reservations.check_at_start(key, reservation), stage=stage
        )

    @functools.cached_property
    def results(self) -> Results:
        """What every synthesis of this backend ends in: stored, counted, settled (`local.results`)."""
        return Results(
            host=self.host,
            outputs=self.outputs,
            metrics=self.metrics,
            startup=self.startup,
            reservations=self.reservations,
            upload_outputs=self.upload_outputs,
            labels=self.labels,
        )

    # -- jobs (`local.job_runner`) --------------------------------------------------------------------------

    @functools.cached_property
    def job_runner(self) -> LocalJobs:
        return LocalJobs(
            host=self.host,
            scheduler=self.scheduler,
            jobs=self.jobs,
            batches=self.batches,
            outputs=self.outputs,
            quota=JobQuota(self.quota, self.jobs, self.key_lookup),
            reservations=self.reservations,
            results=self.results,
            max_text_chars=self.limits.max_text_chars,
            segment_timeout_s=self.queue.job_segment_timeout_s,
            lease_s=self.queue.job_lease_s,
            owns_jobs=self.recover_jobs,
            node=f"{socket.gethostname()}-{os.getpid()}",
            # An interrupted job runs again here; a worker's goes back to the Celery queue instead.
            requeue=(lambda job_id: self.feeder.requeue(job_id)) if self.recover_jobs else None,
            pieces=JobPieces(self.outputs.root),
        )

    @functools.cached_property
    def feeder(self) -> JobFeeder:
        return JobFeeder(self.job_runner, self.queue.job_max_attempts)

    def submit_job(self, request: SynthesisRequest, spec: OutputSpec) -> JobRecord:
        """Accept a (possibly long) text as a job; its record always ends done, failed or cancelled."""
        self.require_ready()
        return self.job_runner.submit_job(request, spec.checked(self.model_info.get("sample_rate")))

    def submit_batch(self, batch: BatchSubmission, spec: OutputSpec) -> JobRecord:
        """Accept a batch or a dub of checked items as one job."""
        self.require_ready()
        return self.job_runner.submit_batch(batch, spec.checked())

    def run_claimed_job(
        self, job_id: str, attempt: int, request: SynthesisRequest, spec: OutputSpec
    ) -> Ticket:
        """Run a job this worker claimed (`JobStore.claim`) as `attempt`; its results land only while that
        attempt is still the job's current one."""
        return self.job_runner.run_claimed_job(job_id, attempt, request, spec)

    def run_claimed_batch(self, job_id: str, attempt: int) -> Ticket:
        """Run a batch or a dub this worker claimed as `attempt` (from its record and items)."""
        return self.job_runner.run_claimed_batch(job_id, attempt)

    def cancel_job(self, job_id: str) -> JobRecord:
        """Cancel a queued or running job (JobStateError if it already ended)."""
        return self.job_runner.cancel_job(job_id)

    # -- voices --------------------------------------------------------------------------------------------

    def submit_enrolment(self, enrolment: EnrolmentRequest, *, request_id: str | None = None) -> Ticket:
        """Analyse and store a new voice (the prompt models run on the accelerator too)."""
        self.require_ready()
        e = enrolment

        def work(ctx: WorkContext) -> Voice:
            # A key revoked while this waited saves no voice (a leaked key stored a recording after the
            # revoke); one made a user key meanwhile may no longer share it.
            key = KeyWatch(self.key_lookup, key_id_of(e.owner)).check(stage="start")
            if key is not None and e.shared and not key.is_admin:
                raise KeyChanged(
                    f"API key {key.id} became a user key before this enrolment ran: no voice was saved; "
                    "enrol it again (a user key's voices are its own, not shared)"
                )
            with request_context(request_id), self.host.synthesizer(work=ctx) as synth:
                return synth.add_voice(
                    e.name,
                    e.audio,
                    e.transcript,
                    audio_suffix=e.suffix,
                    defaults=e.defaults,
                    lexicon=e.lexicon,
                    owner=e.owner,
                    shared=e.shared,
                    consent=e.consent,
                )

        return self.scheduler.submit(
            work,
            on_state=enrolment_logger(
                e.name,
                request_id,
                self.model_info.get("device"),
                consent=bool(e.consent),
                enroller=(e.consent or {}).get("by") or e.owner,
            ),
        )
