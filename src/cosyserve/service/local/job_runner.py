"""Jobs on the local backend: long texts, batches and dubs submitted to the scheduler as claimed attempts.

Every job is a row in the job table first and a ticket on the scheduler second; its work claims the row as
a numbered attempt when it starts (`JobStore.claim`, the same as a distributed worker does), then runs a
long text (`local.long_text_jobs.run_pieces`) or a batch (`local.batches.BatchRunner`). What a job needs
to run again after a restart — its request, how its result is delivered, its uploaded recording — is kept
with it, so `resubmit` can put it back on the scheduler from its record alone. An attempt that follows one
a crash interrupted first looks for the result the earlier attempt saved, so nothing is produced twice.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cosyserve.errors import Cancelled, CosyServeError, StorageError
from cosyserve.service import wire
from cosyserve.service.activity import both, synthesis_logger
from cosyserve.service.backend import admitted_job_pieces, cancellable_job, job_pieces, new_job_id
from cosyserve.service.batches.items import batch_request
from cosyserve.service.batches.submission import BatchSubmission, record_batch
from cosyserve.service.local.batches import BatchPlan, BatchRunner
from cosyserve.service.local.job_quota import JobQuota
from cosyserve.service.local.job_resume import made_with, resumed_pieces, saved_result
from cosyserve.service.local.job_state import RECORD_WAIT_S, JobStateRecorder
from cosyserve.service.local.long_text_jobs import CLIENT_CANCEL, JobResult, JobRun, run_pieces
from cosyserve.service.local.model_host import ModelHost
from cosyserve.service.local.results import Results
from cosyserve.service.local.voice_pins import SNAPSHOTS, VoicePins, resolve_batch, resolve_request
from cosyserve.service.logs import request_context
from cosyserve.service.requests import (
    TERMINAL_STATES,
    OutputSpec,
    SynthesisRequest,
    VoiceScope,
)
from cosyserve.service.reservations import QuotaReservations
from cosyserve.service.scheduling.scheduler import Scheduler, Ticket, WorkContext
from cosyserve.service.stores.batches import BatchStore
from cosyserve.service.stores.job_pieces import JobPieces
from cosyserve.service.stores.jobs import JobNotFound, JobRecord, JobStore
from cosyserve.service.stores.outputs import OutputStore

Body = Callable[[WorkContext, JobRun], JobResult]

log = logging.getLogger(__name__)
END_WRITE_WAIT_S = 10.0  # how long a cancel waits for a finishing attempt to record its end (one write)


@dataclass(frozen=True)
class LocalJobs:
    """Submits, resubmits and cancels this process's jobs; `results` stores and counts each synthesis."""

    host: ModelHost
    scheduler: Scheduler
    jobs: JobStore
    batches: BatchStore
    outputs: OutputStore
    quota: JobQuota
    results: Results  # stores, counts and settles each synthesis; runs its engine calls
    max_text_chars: int
    segment_timeout_s: float
    lease_s: float
    owns_jobs: bool  # this process alone runs the table's jobs: a shutdown leaves them queued
    node: str  # the name its attempts are recorded under
    reservations: QuotaReservations  # a job holds its estimate of its key's quota until its record ends
    requeue: Callable[[str], object] | None = None  # runs a job an engine restart interrupted again
    pieces: JobPieces | None = None  # a long text's finished pieces, for an attempt that follows a crash

    # -- submitting -------------------------------------------------------------------------------------

    def submit_job(self, request: SynthesisRequest, spec: OutputSpec) -> JobRecord:
        """Accept a (possibly long) text as a job; its record always ends done, failed or cancelled.
        QuotaExceeded when its whole estimate does not fit in its key's quota."""
        thresholds = self.host.settings.quality.policy().thresholds
        pieces = admitted_job_pieces(request, self.max_text_chars, thresholds)  # refused now, not when run
        snapshots = resolve_request(self.host.voices, request, spec.voice_scope)
        job_id = new_job_id()
        spec = dataclasses.replace(spec, extra={**spec.extra, "job_id": job_id})
        estimate = self.reservations.estimate(request, spec.voice_scope)

        def create() -> JobRecord:
            return self.jobs.create(
                {**wire.encode_job_request(request, spec), SNAPSHOTS: snapshots},
                kind="tts",
                owner=spec.owner,
                job_id=job_id,
                spec=wire.encode_job_spec(spec),
                reserved_s=estimate,
                prompt_wav=request.prompt_wav,
            )

        body = self._tts_body(job_id, request, spec, pieces, spec.voice_scope, snapshots)
        units = self._segment_count(request, pieces, spec.voice_scope)
        submit = lambda: self._submit(job_id, "tts", body, create, spec, request, units)  # noqa: E731
        return self.reservations.job_submitted(job_id, spec.key, estimate, submit)

    def submit_batch(self, batch: BatchSubmission, spec: OutputSpec) -> JobRecord:
        """Accept a batch (kind "batch") or a dub (kind "dub") of checked items; items with a problem are
        stored failed at once. QuotaExceeded when its estimate (a batch: its items'; a dub: its track's
        length) does not fit in its key's quota."""
        batch = resolve_batch(self.host.voices, batch, spec.voice_scope)
        kind, shared, job_id = batch.kind, batch.shared, new_job_id()
        reserved = self.reservations.batch_estimate(batch, spec.voice_scope)
        create = lambda: record_batch(self.jobs, self.batches, batch, job_id, spec, reserved)  # noqa: E731
        unkeyed = dataclasses.replace(spec, key=None)  # items are charged by the runner
        plan = BatchPlan(job_id, kind, dict(shared), batch.prompt_wav, unkeyed, spec.voice_scope)
        asked = batch_request(shared, [item.params for item in batch.items])
        to_run = sum(1 for item in batch.items if item.problem is None)
        submit = lambda: self._submit(job_id, kind, self._batch_body(plan), create, spec, asked, to_run)  # noqa: E731
        return self.reservations.job_submitted(job_id, spec.key, reserved, submit)

    def run_claimed_job(
        self, job_id: str, attempt: int, request: SynthesisRequest, spec: OutputSpec
    ) -> Ticket:
        """Run a job a distributed worker claimed as `attempt`; its results land only while that attempt
        is still the job's current one."""
        pieces = job_pieces(request, self.max_text_chars)
        spec = dataclasses.replace(spec, extra={**spec.extra, "job_id": job_id})  # a retry finds its output
        record = self.jobs.get(job_id)
        snapshots = (record.params or {}).get(SNAPSHOTS) if record is not None else None
        body = self._tts_body(job_id, request, spec, pieces, spec.voice_scope, snapshots)
        units = self._segment_count(request, pieces, spec.voice_scope)
        return self._ticket(job_id, "tts", body, spec, _set_event(), request, attempt, units)

    def run_claimed_batch(self, job_id: str, attempt: int) -> Ticket:
        """Run a batch or a dub a distributed worker claimed as `attempt`, from its record and items."""
        record = self.jobs.get(job_id)
        if record is None:
            raise JobNotFound(f"no job {job_id!r}: it was purged")
        return self.resubmit(record, attempt=attempt)

    def resubmit(self, record: JobRecord, *, attempt: int | None = None) -> Ticket:
        """Put a queued job back on the scheduler from its record (after a restart; on a worker, as the
        attempt it claimed); QueueFull when the queue has no room yet."""
        spec = wire.decode_job_spec(record.spec, record.params, record.owner, self.quota.key_lookup)
        voices = _scope_of(record, spec)
        prompt_wav = self.jobs.prompt_wav(record.id)
        if record.kind == "tts":
            asked = wire.decode_job_request(record.params, prompt_wav)
            pieces = job_pieces(asked, self.max_text_chars)
            snapshots = (record.params or {}).get(SNAPSHOTS)
            body = self._tts_body(record.id, asked, spec, pieces, voices, snapshots)
            units = self._segment_count(asked, pieces, voices)
        else:
            plan_spec = dataclasses.replace(spec, key=None)  # items are charged by the runner
            plan = BatchPlan(record.id, record.kind, dict(record.params), prompt_wav, plan_spec, voices)
            body = self._batch_body(plan)
            asked = batch_request(record.params, [item.params for item in self.batches.items(record.id)])
            counts = self.batches.counts(record.id)
            units = counts.queued + counts.running  # the items a resumed batch still runs
        return self._ticket(record.id, record.kind, body, spec, _set_event(), asked, attempt, units)

    def cancel_job(self, job_id: str) -> JobRecord:
        """Cancel a queued or running job (JobStateError if it already ended)."""
        record = cancellable_job(self.jobs, job_id)
        if not self.scheduler.cancel(job_id, CLIENT_CANCEL):
            if record.state == "running" and record.worker == self.node:
                record = self._after_its_end_is_written(job_id)  # JobStateError once it ended
                if self.scheduler.cancel(job_id, CLIENT_CANCEL):  # (back in the queue meanwhile)
                    return self.jobs.get(job_id) or record
            # Not on this process's scheduler (waiting to be resubmitted): end the record itself.
            if record.kind != "tts":  # the items first: whoever sees the batch cancelled sees them ended
                self.batches.cancel_rest(job_id, "cancelled", "cancelled by the client")
            ended = self.jobs.finish_cancelled(job_id, "cancelled by the client")
            self.ended_unrun(job_id)
            return ended
        return self.jobs.get(job_id) or record

    def _after_its_end_is_written(self, job_id: str) -> JobRecord:
        """A job running here but no longer on the scheduler has just ended its attempt: its recorder is
        writing how (done with its result, or back to the queue). Ending the record in that moment threw
        the result away (a dub's track deleted, its key still charged): wait for the write, then the record
        as `cancellable_job` gives it."""
        deadline = time.monotonic() + END_WRITE_WAIT_S
        while (now := self.jobs.get(job_id)) is not None and now.state == "running":
            if time.monotonic() > deadline or self.scheduler.get(job_id) is not None:
                break
            time.sleep(0.02)
        return cancellable_job(self.jobs, job_id)

    def ended_interrupted(self, record: JobRecord) -> None:
        """A job that failed at start, interrupted by restarts as often as the retry limit allows: a batch's
        unfinished items end with it (they stayed queued for ever), its result says what it kept, and
        what it held is given back."""
        if record.kind != "tts":
            message = record.error_message or "interrupted by restarts"
            self.batches.cancel_rest(record.id, record.error_code or "interrupted", message)
            self.jobs.add_result_extra(record.id, self.batches.kept(record.id))
            self.reservations.release_job(record.id)
        else:  # a long text keeps nothing of an attempt: what its attempts were charged goes back
            self.ended_unrun(record.id)

    def sweep_pieces(self) -> None:
        """Remove the kept pieces of jobs that ended while no server ran them (cancelled, purged)."""
        if self.pieces is not None:
            active = lambda job_id: (r := self.jobs.get(job_id)) is not None and not r.is_terminal  # noqa: E731
            if removed := self.pieces.sweep(active):
                log.info("removed the kept pieces of %d jobs that have ended", removed)

    def progressed(self, job_id: str, attempt: int) -> bool:
        """Whether a long text's attempt `attempt` finished a piece (kept on disk) before it was stopped."""
        return self.pieces is not None and self.pieces.made_in(job_id, attempt)

    def ended_unrun(self, job_id: str) -> None:
        """A job whose record ended while no attempt of it ran: what it held goes (a long text's kept
        pieces, what they were charged, its reservation)."""
        self.reservations.ended_unkept(self.jobs, job_id)
        self.drop_pieces(job_id)

    def drop_pieces(self, job_id: str) -> None:
        """Remove what a long text kept of its finished pieces (its record ended)."""
        if self.pieces is not None:
            self.pieces.drop(job_id)

    def _segment_count(self, request: SynthesisRequest, pieces: list[str], voices: VoiceScope) -> int:
        """A long text's units for the queue's wait estimates: its segments (`run_pieces` gives the engine
        back after each), split as synthesis splits them. Only the text is prepared, no audio is made; with
        no model loaded (no tokenizer yet), or for a piece synthesis will refuse, a piece counts as one."""
        synth = self.host.loaded
        if synth is None:
            return len(pieces)
        total = 0
        for piece in pieces:
            try:
                total += synth.segment_count(dataclasses.replace(request, text=piece), voices)
            except CosyServeError:  # the work refuses it with the reason when it runs
                total += 1
        return total

    # -- the work ---------------------------------------------------------------------------------------

    def _submit(
        self,
        job_id: str,
        kind: str,
        body: Body,
        create: Callable[[], JobRecord],
        spec: OutputSpec,
        asked: SynthesisRequest,
        units: int,
    ) -> JobRecord:
        # The ticket first: a full queue refuses the job before any record exists.
        recorded = threading.Event()
        ticket = self._ticket(job_id, kind, body, spec, recorded, asked, units=units)
        try:
            record = create()
        except BaseException:
            recorded.set()  # before cancelling: on_state waits for it
            ticket.cancel("the job record could not be written")
            raise
        recorded.set()
        return record

    def _ticket(
        self,
        job_id: str,
        kind: str,
        body: Body,
        spec: OutputSpec,
        recorded: threading.Event,
        asked: SynthesisRequest,
        attempt: int | None = None,
        units: int | None = None,
    ) -> Ticket:
        """`asked`: what the activity log says was asked (a batch: its texts, its shared voice); `units`:
        its segments (a job) or the items it still runs (a batch, a dub), for the queue's wait estimates."""
        key_id = spec.key.id if spec.key is not None else (spec.extra.get("key_id") if spec.extra else None)
        recorder = JobStateRecorder(
            self.jobs,
            self.batches,
            self.outputs,
            job_id,
            kind,
            recorded,
            keep_queued=self.owns_jobs,
            requeue=self.requeue,
            refund=lambda: self.quota.refund_discarded(key_id, job_id),
        )
        event = "job" if kind == "tts" else kind
        device = self.host.info.get("device")
        logged = synthesis_logger(event, asked, spec, device, job_id, kept_queued=self.owns_jobs)

        def work(ctx: WorkContext) -> JobResult:
            recorded.wait(RECORD_WAIT_S)
            number = attempt
            if number is None:
                claimed = self.jobs.claim(job_id, self.node, self.lease_s)
                if claimed is None:
                    raise Cancelled("the job ended before it started")
                number = claimed.attempt
            recorder.attempt = number
            run = JobRun(job_id, number, key_id, self.jobs, self.quota, self.segment_timeout_s)
            with request_context(spec.request_id):
                return body(ctx, run)

        # No scheduler timeout: each segment (or item) sets its own (`JobRun.arm`).
        on_state = both(both(recorder, logged), self._released_when_ended(job_id, key_id is not None))
        # Background work: it gives the engine back between its units (segments, items, cues).
        return self.scheduler.submit(
            work,
            job_id=job_id,
            owner=spec.owner,
            on_state=on_state,
            timeout_s=None,
            work_class="background",
            units=units,
        )

    def _released_when_ended(self, job_id: str, reserved: bool) -> Callable[[Ticket, str], None]:
        """An `on_state` that gives back what the job still holds (its reservation when `reserved`, its
        kept pieces) once its record ended (not when a shutdown leaves it queued for the next start)."""

        def on_state(ticket: Ticket, state: str) -> None:
            if state in TERMINAL_STATES:
                record = self.jobs.get(job_id)
                if record is None or record.is_terminal:
                    if reserved:
                        self.reservations.release_job(job_id)
                    self.drop_pieces(job_id)

        return on_state

    def _tts_body(
        self,
        job_id: str,
        request: SynthesisRequest,
        spec: OutputSpec,
        pieces: list[str],
        voices: VoiceScope,
        snapshots: dict[str, Any] | None,
    ) -> Body:
        def body(ctx: WorkContext, run: JobRun) -> JobResult:
            extra: dict[str, Any] = {"format": spec.format, "pieces": len(pieces)}
            if run.attempt > 1 and (saved := saved_result(self.outputs, job_id, spec.owner)) is not None:
                return JobResult(saved, extra)
            with self.host.synthesizer(work=ctx) as synth:
                # the voice is looked up once per attempt, by the id it was submitted with
                pins = VoicePins(self.host.voices, snapshots, voices)
                pinned = pins.pin(request.voice, synth.voice_features)
                kept, keep = resumed_pieces(self.pieces, job_id, pieces, made_with(self.host.info), run)
                made = self.results.run_engine(
                    lambda: run_pieces(ctx, synth, request, pieces, run, voices, pinned, kept, keep)
                )
                if made.stopped is None:
                    ctx.check_cancelled()  # lost the job while finishing the last piece: no output
                else:
                    extra["partial"] = made.partial()
                # The key was charged segment by segment (`run_pieces`), not again here. The kept pieces
                # hold ~2x the result's bytes on the same disk: a failed save gives their room to the
                # result (all of it is in memory now) and tries once more.
                kept_pieces = self.pieces
                outcome = self.results.finish(
                    synth,
                    request,
                    made.result,
                    dataclasses.replace(spec, key=None),
                    encoded=False,
                    make_room=(lambda: kept_pieces.drop(job_id)) if kept_pieces is not None else None,
                    fails_the_job=True,
                )
            if outcome.output_id is None:
                raise StorageError(
                    f"the job's audio could not be saved ({outcome.storage_error or 'see the server log'}): "
                    "make room in the output directory, then submit the job again"
                )
            return JobResult(outcome, extra, made.stopped)

        return body

    def _batch_body(self, plan: BatchPlan) -> Body:
        runner = BatchRunner(self.host, self.batches, self.outputs, self.results)
        return lambda ctx, run: runner.run(ctx, plan, run)


def _scope_of(record: JobRecord, spec: OutputSpec) -> VoiceScope:
    """The voices a job run again may use: its key's; its owner's own and the shared ones when its key
    was revoked or deleted since (never more than it had)."""
    if spec.key is None and (record.spec or {}).get("key_id") is not None:
        return VoiceScope(owner=record.owner, everything=False)
    return spec.voice_scope


def _set_event() -> threading.Event:
    event = threading.Event()
    event.set()
    return event
