"""The API node's backend in distributed mode: send work to the workers and relay what comes back.

An API node loads no model; what it knows of the model comes from the workers' heartbeats. Interactive
requests (`/v1/tts`, OpenAI speech, voice enrolment) still go through the node's own bounded scheduler,
so 429s, timeouts, disconnect-cancel and shutdown behave exactly as on one machine; the work a slot runs
is "send a Celery task, then read its relay stream". Jobs are fire-and-forget: a row in the shared
database plus a late-acknowledged Celery message, so they survive a restart of the API node and the loss
of a worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from typing import Any

from cosyserve.errors import Cancelled, InputError, JobStateError, ShuttingDown
from cosyserve.service import wire
from cosyserve.service.backend import AudioStream, admitted_job_pieces, cancellable_job, new_job_id
from cosyserve.service.batches.submission import BatchSubmission, record_batch
from cosyserve.service.distributed.background_share import BackgroundShares
from cosyserve.service.distributed.celery_app import (
    BATCH_TASK,
    ENROL_TASK,
    JOB_TASK,
    TTS_TASK,
    make_celery,
    queue_of,
)
from cosyserve.service.distributed.relay import Relay, RelayItem, WorkerRegistry, connect
from cosyserve.service.distributed.task_reader import TaskReader
from cosyserve.service.local.voice_pins import SNAPSHOTS, resolve_batch, resolve_request
from cosyserve.service.outcomes import StreamStart, TtsOutcome
from cosyserve.service.requests import EnrolmentRequest, OutputSpec, SynthesisRequest
from cosyserve.service.reservations import QuotaReservations
from cosyserve.service.scheduling.key_share import share_key
from cosyserve.service.scheduling.scheduler import Scheduler, Ticket, WorkContext
from cosyserve.service.settings import Settings
from cosyserve.service.stores.batches import BatchStore
from cosyserve.service.stores.jobs import JobRecord, JobStore
from cosyserve.service.stores.voices import Voice, VoiceLibrary

log = logging.getLogger(__name__)

WORKERS_CACHE_S = 2.0  # how long the list of live workers is reused for readiness checks


class RemoteBackend:
    """Sends work to `cosyserve worker` processes through Celery and reads their results from Redis."""

    def __init__(
        self,
        settings: Settings,
        scheduler: Scheduler,
        *,
        jobs: JobStore,
        voices: VoiceLibrary,
        batches: BatchStore,
        reservations: QuotaReservations | None = None,
    ) -> None:
        queue = settings.queue
        if not queue.queue_url:
            raise ValueError("RemoteBackend needs queue_url")
        self.scheduler = scheduler
        self.jobs = jobs
        self.voices = voices
        self.batches = batches
        self.reservations = reservations  # this node reserves a key's quota, the worker settles
        self.max_text_chars = settings.limits.max_text_chars
        self.thresholds = settings.quality.policy().thresholds  # the workers' (one settings for all nodes)
        self.model_info: dict[str, Any] = {"model": settings.engine.model, "device": settings.engine.device}
        self.url = queue.queue_url
        self.app = make_celery(self.url, visibility_timeout_s=queue.visibility_timeout_s)
        self.client = connect(self.url)
        self.relay = Relay(self.client)
        self.registry = WorkerRegistry(self.client)
        self.shares = BackgroundShares(self.client)  # which keys have background work waiting
        self.reader = TaskReader(self.relay, self.workers, _where(self.url))
        self._workers: tuple[float, list[dict[str, Any]]] = (0.0, [])
        self._workers_lock = threading.Lock()

    def start(self) -> None:
        if self.reservations is not None:
            self.reservations.release_dead(self.jobs)
        try:
            self.client.ping()
        except Exception as exc:  # the node still starts: /ready says why it is not ready
            log.error("the queue at %s cannot be reached: %s", _where(self.url), exc)

    def stop(self) -> None:
        self.client.close()

    # -- readiness ---------------------------------------------------------------------------------------

    def workers(self, *, fresh: bool = False) -> list[dict[str, Any]]:
        """Live workers' heartbeat info (cached briefly); raises wire.QueueUnavailable when Redis is down."""
        with self._workers_lock:
            checked_at, workers = self._workers  # an empty answer is never reused: new workers count at once
            if fresh or not workers or time.monotonic() - checked_at > WORKERS_CACHE_S:
                try:
                    workers = self.registry.alive()
                except Exception as exc:
                    raise wire.QueueUnavailable(
                        f"the queue at {_where(self.url)} cannot be reached ({type(exc).__name__}): "
                        "check that Redis runs and queue_url points at it"
                    ) from exc
                self._workers = (time.monotonic(), workers)
                if workers:
                    self.model_info = _model_info(workers[0])
        return workers

    def readiness(self, detailed: bool, *, accepting: bool) -> dict[str, Any]:
        try:
            workers = self.workers()
            reason = None if workers else "no worker is connected: start `cosyserve worker --queue …`"
        except wire.QueueUnavailable as exc:
            workers, reason = [], str(exc)
        if reason is None and not accepting:
            reason = "the server is shutting down"
        info = {k: v for k, v in self.model_info.items() if detailed or k != "model_path"}
        body: dict[str, Any] = {
            "ready": reason is None,
            "state": "ready" if workers else "no_workers",
            "reason": reason,
            **info,
            "role": "api",
            "workers": len(workers),
        }
        if detailed:
            body["worker_info"] = workers
        return body

    def require_ready(self) -> None:
        if not self.workers():
            raise wire.NoWorkers(
                "no worker is connected to the queue: start `cosyserve worker --queue …` "
                "(GET /ready says when one is)"
            )

    def restart_engine(self) -> str:
        raise InputError(
            "this API node runs no model: restart the `cosyserve worker` processes instead "
            "(one at a time; their jobs move to the others)"
        )

    # -- interactive work --------------------------------------------------------------------------------

    def submit_tts(self, request: SynthesisRequest, spec: OutputSpec) -> Ticket:
        """One synthesis on a worker; this node's scheduler slot relays its outcome."""
        self.require_ready()
        spec = spec.checked(self.model_info.get("sample_rate"))
        return self._submit_held(request, spec, stream=False)

    def stream_tts(self, request: SynthesisRequest, spec: OutputSpec) -> AudioStream:
        """One streamed synthesis on a worker; this node's scheduler slot relays its chunks."""
        self.require_ready()
        spec = spec.checked(self.model_info.get("sample_rate"))
        request = dataclasses.replace(request, stream=True)
        return AudioStream(self._submit_held(request, spec, stream=True))

    def _submit_held(self, request: SynthesisRequest, spec: OutputSpec, *, stream: bool) -> Ticket:
        """Reserve the estimate, then queue the relay: the worker settles it (the spec carries it)."""

        def submit(spec: OutputSpec, on_state: Any) -> Ticket:
            work = self.tts_work(request, spec, stream)
            return self.scheduler.submit(work, owner=spec.owner, stream=stream, on_state=on_state)

        if self.reservations is None:  # a node without quotas (unit tests)
            return submit(spec, None)
        return self.reservations.submitted(request, spec, submit)

    def submit_enrolment(self, enrolment: EnrolmentRequest, *, request_id: str | None = None) -> Ticket:
        """A voice enrolment on a worker (the prompt models run on its accelerator)."""
        self.require_ready()
        return self.scheduler.submit(self.enrol_work(enrolment))

    def tts_work(
        self, request: SynthesisRequest, spec: OutputSpec, stream: bool
    ) -> Callable[[WorkContext], Any]:
        """The work for one scheduler slot: a task on a worker, relayed (chunks too when `stream`)."""
        args = [wire.encode_request(request), wire.encode_spec(spec), stream]

        def work(ctx: WorkContext) -> Any:
            task_id = self._send(TTS_TASK, args)
            items = self.reader.items(task_id, ctx)
            if stream:
                return self._stream(task_id, items)
            try:
                return wire.decode_outcome(_json(_until_done(items)))
            finally:
                self.reader.drop_quietly(task_id)

        return work

    def _stream(
        self, task_id: str, items: Iterator[RelayItem]
    ) -> Generator[StreamStart | bytes, None, TtsOutcome]:
        """The relayed stream: the worker's StreamStart, its chunks, and its outcome as the return value."""
        try:
            for item in items:
                if item.kind == "start":
                    yield wire.decode_stream_start(_json(item))
                elif item.kind == "chunk":
                    yield item.data
                elif item.kind == "done":
                    return wire.decode_outcome(_json(item))
            raise wire.WorkerLost("the worker's output ended early")  # pragma: no cover - the reader raises
        finally:
            self.reader.drop_quietly(task_id)

    def enrol_work(self, enrolment: EnrolmentRequest) -> Callable[[WorkContext], Voice]:
        args = wire.encode_enrolment(enrolment)

        def work(ctx: WorkContext) -> Voice:
            task_id = self._send(ENROL_TASK, args)
            try:
                voice = _json(_until_done(self.reader.items(task_id, ctx)))
            finally:
                self.reader.drop_quietly(task_id)
            return self.voices.get(voice["id"])

        return work

    # -- jobs --------------------------------------------------------------------------------------------

    def submit_job(self, request: SynthesisRequest, spec: OutputSpec) -> JobRecord:
        """Record the job (its estimate reserved here), then queue it; if the queue refuses it it fails."""
        self.require_ready()
        spec = spec.checked(self.model_info.get("sample_rate"))
        admitted_job_pieces(request, self.max_text_chars, self.thresholds)  # refused now, not on a worker
        snapshots = resolve_request(self.voices, request, spec.voice_scope)  # the voice as it is now
        job_id = new_job_id()
        estimate = self.reservations.estimate(request, spec.voice_scope) if self.reservations else None

        def submit() -> JobRecord:
            params = {**wire.encode_job_request(request, spec), SNAPSHOTS: snapshots}
            jobs = self.jobs
            record = jobs.create(params, kind="tts", owner=spec.owner, job_id=job_id, reserved_s=estimate)
            try:
                args = [job_id, wire.encode_request(request), wire.encode_spec(spec)]
                self._send_background(JOB_TASK, args, job_id, spec.owner)
            except wire.QueueUnavailable as exc:
                with contextlib.suppress(JobStateError):  # nobody else knows the job yet
                    self.jobs.finish_failed(job_id, "queue_unavailable", str(exc))
                raise
            return record

        return self._job_held(job_id, spec, estimate, submit)

    def submit_batch(self, batch: BatchSubmission, spec: OutputSpec) -> JobRecord:
        """Record the batch and its items, then queue it: a worker claims it and runs its items in order
        (after a worker dies, another goes on at the first unfinished item); its estimate is reserved here."""
        self.require_ready()
        spec = spec.checked()
        batch = resolve_batch(self.voices, batch, spec.voice_scope)  # the voices as they are now
        job_id = new_job_id()
        held = self.reservations
        reserved = held.batch_estimate(batch, spec.voice_scope) if held else None

        def submit() -> JobRecord:
            record = record_batch(self.jobs, self.batches, batch, job_id, spec, reserved)
            try:
                self._send_background(BATCH_TASK, [job_id], job_id, spec.owner)
            except wire.QueueUnavailable as exc:
                with contextlib.suppress(JobStateError):  # nobody else knows the batch yet
                    self.jobs.finish_failed(job_id, "queue_unavailable", str(exc))
                self.batches.cancel_rest(job_id, "queue_unavailable", str(exc))
                raise
            return record

        return self._job_held(job_id, spec, reserved, submit)

    def _job_held(self, job_id: str, spec: OutputSpec, seconds: float | None, submit: Any) -> JobRecord:
        if not self.scheduler.accepting:  # a drain takes no new jobs either (they bypass its queue)
            raise ShuttingDown("the server is shutting down and accepts no new work: retry after it restarts")
        if self.reservations is None or seconds is None:
            return submit()
        return self.reservations.job_submitted(job_id, spec.key, seconds, submit)

    def cancel_job(self, job_id: str) -> JobRecord:
        """End the record now; the worker running it (if any) sees the cancel and stops."""
        if cancellable_job(self.jobs, job_id).kind != "tts":  # the items first, as LocalBackend does
            self.batches.cancel_rest(job_id, "cancelled", "cancelled by the client")
        record = self.jobs.finish_cancelled(job_id, "cancelled by the client")
        if self.reservations is not None:  # (a dead worker's kept pieces are charged: taken back)
            self.reservations.ended_unkept(self.jobs, job_id)
        try:
            self.relay.request_cancel(job_id)
            self.shares.dropped(job_id, share_key(record.owner))  # other keys need not wait for it
        except Exception as exc:  # the record is cancelled; the worker notices at its next lease renewal
            log.warning("could not flag job %s as cancelled in the queue: %s", job_id, exc)
        return record

    # -- internals ---------------------------------------------------------------------------------------

    def _send(self, task: str, args: list[Any], task_id: str | None = None) -> str:
        task_id = task_id or uuid.uuid4().hex
        try:
            self.app.send_task(task, args=args, task_id=task_id, queue=queue_of(task))
        except Exception as exc:
            raise wire.QueueUnavailable(
                f"the queue at {_where(self.url)} refused the task ({type(exc).__name__}: {exc}): "
                "check that Redis runs; retry in a few seconds"
            ) from exc
        return task_id

    def _send_background(self, task: str, args: list[Any], job_id: str, owner: str | None) -> None:
        """Send a job's task, counted as waiting for its key until a worker claims it (keys take turns
        for the cluster's background slots: `scheduling/key_share.py`)."""
        self.shares.send_counted(job_id, share_key(owner), lambda: self._send(task, args, job_id))


def _until_done(items: Iterator[RelayItem]) -> RelayItem:
    for item in items:
        if item.kind == "done":
            return item
    raise Cancelled("the request ended without a result")  # pragma: no cover - the reader raises first


def _json(item: RelayItem) -> Any:
    return wire.from_json(item.data)


def _model_info(worker: dict[str, Any]) -> dict[str, Any]:
    keys = ("model", "model_path", "fingerprint", "device", "sample_rate", "demo", "preset")
    return {key: worker[key] for key in keys if key in worker}


def _where(url: str) -> str:
    """The broker URL without credentials, for messages and logs."""
    head, _, tail = url.rpartition("@")
    return url if not head else url.split("://", 1)[0] + "://" + tail
