"""A job's record follows its ticket: `JobStateRecorder` is the ticket's `on_state`. The record ends done
with the stored output, failed or cancelled, written only while the attempt is the job's current one (an
output made by an attempt that lost the job is deleted again); an interrupted attempt puts it back in the
queue. A database that cannot take the end now (its disk full) is tried again until it can: a record left
"running" would stay so until a restart."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from cosyserve.errors import (
    Cancelled,
    Interrupted,
    JobStateError,
    ShuttingDown,
    error_code,
    is_resource_exhausted,
)
from cosyserve.service.local.long_text_jobs import JobResult
from cosyserve.service.quality.reporting import stored_fields
from cosyserve.service.scheduling.tickets import Ticket
from cosyserve.service.stores.batches import BatchStore
from cosyserve.service.stores.jobs import JobStore
from cosyserve.service.stores.outputs import OutputStore

log = logging.getLogger(__name__)

RECORD_WAIT_S = 30.0  # how long a state change waits for the job's record to be written
RECORD_RETRY_S = 5.0
RECORD_RETRY_FOR_S = 24 * 3600.0


class JobStateRecorder:
    """A job ticket's `on_state`: moves the job's record (and a batch's items) along with the ticket."""

    def __init__(
        self,
        jobs: JobStore,
        batches: BatchStore,
        outputs: OutputStore,
        job_id: str,
        kind: str,
        recorded: threading.Event,
        *,
        attempt: int | None = None,
        keep_queued: bool = False,
        requeue: Callable[[str], object] | None = None,
        refund: Callable[[], object] | None = None,
    ) -> None:
        self.jobs, self.batches, self.outputs = jobs, batches, outputs
        self.job_id, self.kind = job_id, kind
        self.recorded = recorded  # set once the record exists (it is written right after submit returns)
        self.attempt = attempt  # the attempt running it (set by the work once it claimed the job)
        self.keep_queued = keep_queued  # a shutdown leaves the job for this server's next start
        self.requeue = requeue  # runs an interrupted job again (None: whoever sent it sends it again)
        self.refund = refund  # takes back what a long text was charged, when its result is thrown away

    def __call__(self, ticket: Ticket, state: str) -> None:
        self.recorded.wait(RECORD_WAIT_S)
        try:
            self._record(ticket, state)
        except Exception as exc:
            if state == "running" or not is_resource_exhausted(exc):
                raise
            # The database can't take the job's end now (disk full): a record left "running" would stay
            # so until a restart. Try again until it can.
            log.warning(
                "job %s: its end could not be recorded (%s): retrying every %g s",
                self.job_id,
                exc,
                RECORD_RETRY_S,
            )
            threading.Thread(target=self._retry, args=(ticket, state), daemon=True).start()

    def _record(self, ticket: Ticket, state: str) -> None:
        try:
            if state == "done":
                self._done(ticket.value)
            elif state != "running":
                self._ended(ticket.error or Cancelled("cancelled"))
        except JobStateError as exc:
            log.warning("job %s: %s", self.job_id, exc)

    def _retry(self, ticket: Ticket, state: str) -> None:
        deadline = time.monotonic() + RECORD_RETRY_FOR_S
        while time.monotonic() < deadline:
            time.sleep(RECORD_RETRY_S)
            try:
                self._record(ticket, state)
            except Exception as exc:
                if not is_resource_exhausted(exc):
                    log.exception("job %s: recording its end failed", self.job_id)
                    return
                continue
            log.info("job %s: its end was recorded after the database could be written again", self.job_id)
            return

    def _ended(self, error: BaseException) -> None:
        interrupted = isinstance(error, Interrupted)  # an engine restart, a worker's shutdown
        if interrupted or (self.keep_queued and isinstance(error, ShuttingDown)):
            if self.attempt is not None:
                self.jobs.release(self.job_id, self.attempt)
            if interrupted and self.requeue is not None:
                self.requeue(self.job_id)
            return  # still queued: it runs (again) as its next attempt, or at the next start
        code = "cancelled" if isinstance(error, Cancelled) else "batch_stopped"
        message = f"the batch ended before this item ran: {error}"
        if self.kind != "tts":  # its items end first: a client that sees the batch ended sees them ended
            self.batches.cancel_rest(self.job_id, code, message, of_attempt=self.attempt)
        try:
            self.jobs.finish_with_exception(self.job_id, error, attempt=self.attempt)
        finally:  # also when its record was ended elsewhere (a cancel) while items were still starting
            record = self.jobs.get(self.job_id)
            if self.kind != "tts" and record is not None and record.is_terminal:
                self.batches.cancel_rest(self.job_id, code, message)
            self._refund_if_nothing_kept()

    def _done(self, result: JobResult) -> None:
        outcome = result.outcome
        if result.stopped is not None and self.kind != "tts":  # its items end first, as in `_ended`
            self.batches.cancel_rest(
                self.job_id, error_code(result.stopped), str(result.stopped), of_attempt=self.attempt
            )
        try:
            self.jobs.finish_done(
                self.job_id,
                output_id=outcome.output_id if outcome else None,
                output_path=outcome.output_path if outcome else None,
                duration_s=outcome.duration_s if outcome else result.extra.get("audio_s"),
                seed=outcome.seed if outcome else None,
                extra={
                    "warnings": list(outcome.warnings) if outcome else [],
                    **stored_fields(outcome.quality if outcome else None),
                    **result.extra,
                },
                attempt=self.attempt,
                stopped=result.stopped,
            )
        except JobStateError:
            if outcome is not None:
                self._discard_output(outcome.output_id)  # another attempt owns the job's result
            self._refund_if_nothing_kept()
            raise

    def _refund_if_nothing_kept(self) -> None:
        """A long text that ended without a result keeps nothing of what it made (a cluster's API node ends
        a cancelled record at once, and the worker's audio is thrown away): what its segments were charged
        goes back."""
        record = self.jobs.get(self.job_id)
        if self.kind != "tts" or self.refund is None or record is None or record.output_id:
            return
        if record.state not in ("cancelled", "failed"):  # running: another attempt owns it
            return
        try:
            self.refund()
        except Exception as exc:  # the charge stays; the key's day ends anyway
            log.warning("job %s: could not take back the charge of its discarded audio: %s", self.job_id, exc)

    def _discard_output(self, output_id: str | None) -> None:
        if output_id is None:
            return
        try:
            self.outputs.delete(output_id)
        except Exception as exc:  # nothing refers to it; retention removes it later anyway
            log.warning("could not delete the unused output %s: %s", output_id, exc)
