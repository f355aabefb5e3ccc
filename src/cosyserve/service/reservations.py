"""Quota reservations as the backends take them: every path that makes audio for a key holds its
estimate first (`access.quota.QuotaTracker.reserve`, atomic), and gives it back or replaces it with the
real length when it ends.

- A synthesis (`/v1/tts`, OpenAI speech, a voice preview, the UI) holds its text's estimate in the
  voice's pace; the spec carries the reservation's id to whoever runs it (this process, or a worker),
  which settles it with the real length; a failed or cancelled one releases it.
- A job holds its whole text's estimate, a batch the sum of its items', a dub its track's length, under
  the job's id: each segment or item is charged against it (`settle_part`), the rest is released when
  the job's record ends.

Callers without a key, and keys without a quota, hold nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable

from cosyserve.errors import StorageError
from cosyserve.service.access.estimate import request_estimate_s, voice_pace
from cosyserve.service.access.principals import QuotaExceeded
from cosyserve.service.access.quota import QuotaTracker
from cosyserve.service.access.quota_days import seconds_until_reset
from cosyserve.service.batches.dub_plan import track_seconds_of_items
from cosyserve.service.batches.submission import BatchSubmission
from cosyserve.service.requests import TERMINAL_STATES, OutputSpec, SynthesisRequest, VoiceScope
from cosyserve.service.scheduling.tickets import Ticket
from cosyserve.service.stores.jobs import JobRecord, JobStore
from cosyserve.service.stores.keys import ApiKey
from cosyserve.service.stores.voices import VoiceLibrary
from cosyserve.service.wire import job_key_id

log = logging.getLogger(__name__)

OnState = Callable[[Ticket, str], None]
JOB_HOLDER = "job"  # the holder of jobs' reservations: they end with their record, not their process
JOB_RECORD_GRACE_S = 300.0  # a job reservation without a record is an orphan only when older than this


class QuotaReservations:
    """Estimates, holds and gives back quota reservations for one service."""

    def __init__(self, quota: QuotaTracker, voices: VoiceLibrary | None = None) -> None:
        self.quota = quota
        self.voices = voices

    # -- estimates ---------------------------------------------------------------------------------------

    def estimate(self, request: SynthesisRequest, scope: VoiceScope) -> float:
        """The seconds `request` is expected to make, in its saved voice's pace and default speed."""
        pace, speed = None, request.speed
        if request.voice and self.voices is not None:
            try:
                voice = self.voices.get(request.voice, scope)
            except Exception:  # unknown or not usable: the synthesis says so; estimate at an average pace
                voice = None
            if voice is not None:
                pace = voice_pace(voice.transcript, voice.report)
                speed = speed or voice.defaults.speed
        return request_estimate_s(request.text, speed, pace)

    def batch_estimate(self, batch: BatchSubmission, scope: VoiceScope) -> float:
        """A dub: its track's length (the last cue's end); a batch: the sum of its runnable items'."""
        items, shared = batch.items, batch.shared
        if batch.kind == "dub":  # the track, whatever its cues' speech: what the caller gets and is charged
            return round(track_seconds_of_items(item.params for item in items), 2)
        total = 0.0
        for item in items:
            if item.problem is not None:
                continue
            params = item.params
            request = SynthesisRequest(
                text=str(params.get("text") or ""),
                voice=params.get("voice") or shared.get("voice"),
                speed=params.get("speed") or shared.get("speed"),
            )
            total += self.estimate(request, scope)
        return round(total, 2)

    # -- one synthesis -----------------------------------------------------------------------------------

    def hold(self, request: SynthesisRequest, spec: OutputSpec) -> OutputSpec:
        """`spec` with a reservation of `request`'s estimate for its key (QuotaExceeded when it does not
        fit); unchanged without a key, without a quota, or when it already holds one (a worker running
        what its API node reserved)."""
        if spec.key is None or spec.reservation is not None or self.quota.limit_for(spec.key) is None:
            return spec
        seconds = self.estimate(request, spec.voice_scope)
        reservation = self.quota.reserve(spec.key, seconds)
        return dataclasses.replace(spec, reservation=reservation) if reservation else spec

    def submitted(
        self,
        request: SynthesisRequest,
        spec: OutputSpec,
        submit: Callable[[OutputSpec, OnState | None], Ticket],
        then: OnState | None = None,
    ) -> Ticket:
        """`submit(spec, on_state)` with `request`'s estimate held: the spec carries the reservation, the
        `on_state` (after `then`) gives it back when the ticket ends, a refused submit at once."""
        spec = self.hold(request, spec)
        try:
            return submit(spec, self.released_at_end(spec, then))
        except BaseException:
            self.release(spec)
            raise

    def check_at_start(self, key: ApiKey, reservation: str | None = None) -> None:
        """QuotaExceeded when `key`'s day (the one that admitted `reservation`) is used up under its quota
        as it is now: a request admitted earlier does not start once the quota was lowered below the
        usage, or earlier work used it up while it waited (the rule jobs and batch items stop by:
        `local.job_quota`). Its reservation is given back as it ends."""
        limit = self.quota.limit_for(key)
        if limit is None:  # unlimited: no queries on the way to the engine
            return
        if self.quota.used_up(key, reservation):
            raise QuotaExceeded(
                f"the key's daily audio quota of {limit:g} s was used up while this request waited, by "
                "other work or a lowered quota: nothing was made or charged; retry after 00:00 UTC or ask "
                "an admin for a larger quota",
                seconds_until_reset(),
            )

    def settle(self, spec: OutputSpec, seconds: float) -> None:
        """Charge `spec`'s key the real `seconds`, replacing its reservation. The audio exists by now: a
        database that cannot take the charge (its disk full) loses the charge, logged, not the audio."""
        if spec.key is None:
            return
        try:
            self.quota.settle(spec.reservation, spec.key, seconds)
        except StorageError as exc:  # the reservation expires by itself (quota_reservation_ttl_s)
            log.error("key %s was not charged %.2f s of audio it got: %s", spec.key.id, seconds, exc)

    def release(self, spec: OutputSpec) -> None:
        self._release_quietly(spec.reservation)

    def released_at_end(self, spec: OutputSpec, then: OnState | None = None) -> OnState | None:
        """An `on_state` that gives `spec`'s reservation back once its ticket ends (a no-op after `settle`),
        after `then`."""
        reservation = spec.reservation
        if reservation is None:
            return then

        def on_state(ticket: Ticket, state: str) -> None:
            try:
                if then is not None:
                    then(ticket, state)
            finally:
                if state in TERMINAL_STATES:
                    self._release_quietly(reservation)

        return on_state

    # -- jobs --------------------------------------------------------------------------------------------

    def hold_job(self, job_id: str, key: ApiKey | None, seconds: float) -> bool:
        """Reserve a job's estimate under its id (QuotaExceeded when it does not fit); whether anything
        is held."""
        if key is None:
            return False
        # it lives as long as the job's record, however long the job waits for its turn
        held = self.quota.reserve(key, seconds, holder=JOB_HOLDER, reservation_id=job_id, ttl_s=math.inf)
        return held is not None

    def job_submitted(
        self, job_id: str, key: ApiKey | None, seconds: float, submit: Callable[[], JobRecord]
    ) -> JobRecord:
        """`submit()` a job with `seconds` of its key's quota held under its id; a refused submit gives
        them back at once."""
        held = self.hold_job(job_id, key, seconds)
        try:
            return submit()
        except BaseException:
            if held:
                self.release_job(job_id)
            raise

    def release_job(self, job_id: str) -> None:
        """Give back what a job still holds (it ended)."""
        self._release_quietly(job_id)

    def ended_unkept(self, jobs: JobStore, job_id: str) -> None:
        """A long text whose record ended without a result while no attempt ran it (cancelled while its
        worker was dead or it waited to run again, failed as lost): what its attempts were charged (the
        pieces they kept) goes back to its key, then what it still holds. Safe to repeat: the charge is
        taken once."""
        record = jobs.get(job_id)
        key_id = job_key_id(record.spec, record.owner) if record is not None else None
        unkept = record is not None and record.kind == "tts" and not record.output_id and key_id is not None
        try:
            if unkept and (seconds := jobs.take_charged(job_id)) > 0:
                self.quota.refund_part(job_id, key_id, seconds)
        except Exception as exc:  # the charge stays; the key's day ends anyway
            log.warning("job %s: could not take back the charge of its discarded audio: %s", job_id, exc)
        self.release_job(job_id)

    def release_dead(self, jobs: JobStore | None = None) -> None:
        """At start-up: give back what processes on this host that stopped still hold, what expired, and
        (with `jobs`) what jobs hold whose record ended or is gone (a crash came between the two)."""
        try:
            released = self.quota.release_dead()
            if jobs is not None:
                released += self._release_ended_jobs(jobs)
        except Exception as exc:  # requests' expire anyway; jobs' are tried again at the next start
            log.warning("could not release the quota reservations of stopped processes: %s", exc)
            return
        if released:
            log.info("released %d quota reservations of processes that stopped or jobs that ended", released)

    def _release_ended_jobs(self, jobs: JobStore) -> int:
        ended = 0
        # (a job's record is written just after its reservation: a young one may be on its way)
        for job_id in self.quota.held_by(JOB_HOLDER, older_than_s=JOB_RECORD_GRACE_S):
            record = jobs.get(job_id)
            if record is None or record.state in TERMINAL_STATES:
                self.quota.release(job_id)
                ended += 1
        return ended

    def _release_quietly(self, reservation: str | None) -> None:
        if reservation is None:
            return
        try:
            self.quota.release(reservation)
        except Exception as exc:  # it expires by itself (quota_reservation_ttl_s)
            log.warning("could not release quota reservation %s: %s", reservation, exc)
