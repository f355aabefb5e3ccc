"""`cosyserve worker`: one process per accelerator that loads the model once and runs queued tasks.

It lives next to `assembly.py` because it is the worker role's assembly: it builds a `Service` and wires
its `LocalBackend` to the queue. Under `distributed/` it made that folder sit both below `assembly.py`
(which imports `distributed/remote.py`) and above it (this module imports `assembly.py`).

The worker is a `Service` in the "worker" role (the model, the local scheduler with its concurrency limit,
the shared stores) plus a Celery consumer on a thread pool of the same size. Each task runs through the
local scheduler exactly as a request on a single machine does, and what it produces goes to the relay:
stream chunks and the final outcome for interactive tasks, the jobs table for jobs. Background tasks
(jobs, batches, dubs) come in through `worker_jobs.py`: within this worker's slots, and keys taking turns
for the cluster's slots.

While a task runs, a watcher thread renews its lease (a Redis key for interactive tasks, the job row's
lease for jobs), passes a cancel from the relay or a lost job lease on to the ticket, and publishes
progress. A heartbeat thread tells API nodes this worker is alive and what model it serves.

On SIGTERM/SIGINT (Celery's warm shutdown) interactive tasks finish, while running jobs, which may take
long, are interrupted: each goes back to the queue (its attempt released) and its task is sent again, so
another worker, or this one once restarted, goes on with it (a batch after its finished items).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from typing import Any

from celery import signals as celery_signals

from cosyserve.errors import (
    Cancelled,
    CosyServeError,
    ModelDirError,
    SettingsError,
)
from cosyserve.service import wire
from cosyserve.service.assembly import Service
from cosyserve.service.distributed import celery_app
from cosyserve.service.distributed.deleted_outputs import DeletedOutputs, DeletedOutputSweep
from cosyserve.service.distributed.lost_jobs import LostJobSweep
from cosyserve.service.distributed.received_tasks import ReceivedTasks
from cosyserve.service.distributed.relay import Relay, WorkerRegistry, connect
from cosyserve.service.distributed.task_watch import TaskWatch
from cosyserve.service.local.backend import LocalBackend
from cosyserve.service.local.load_failure import load_failure_message
from cosyserve.service.logs import log_failure
from cosyserve.service.scheduling.key_share import share_key
from cosyserve.service.scheduling.tickets import Ticket
from cosyserve.service.settings import Settings
from cosyserve.service.stores.job_table import JobRecord
from cosyserve.service.stores.keys import ApiKey
from cosyserve.service.worker_jobs import JobIntake

log = logging.getLogger(__name__)

MODEL_LOAD_TIMEOUT_S = 3600.0  # a first start may download the model


def default_worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class WorkerNode:
    """A worker process: the model, the Celery consumer, the heartbeat. `run()` blocks until shutdown."""

    def __init__(
        self, settings: Settings, *, name: str | None = None, service: Service | None = None
    ) -> None:
        queue = settings.queue
        if not queue.queue_url:
            raise ValueError("a worker needs queue_url")
        self.settings = settings
        self.name = name or default_worker_name()
        self.hostname = f"{self.name}@{socket.gethostname()}"  # the Celery worker's name
        self.service = service or Service(settings, role="worker")
        if not isinstance(self.service.backend, LocalBackend):
            raise SettingsError("a worker runs the model itself: its service needs the worker role")
        self.local: LocalBackend = self.service.backend
        self.jobs = self.service.jobs
        self.lease_s = queue.job_lease_s
        restore = max(1, min(10, int(queue.visibility_timeout_s // 5)))
        self.app = celery_app.make_celery(
            queue.queue_url, visibility_timeout_s=queue.visibility_timeout_s, restore_interval_s=restore
        )
        self.client = connect(queue.queue_url)
        self.relay = Relay(self.client)
        self.registry = WorkerRegistry(self.client)
        self.received = ReceivedTasks(self.relay, self.name, self.lease_s)  # taken, not started yet
        self.deleted = DeletedOutputSweep(DeletedOutputs(self.client), self.service.outputs.drop_local)
        self._stop = threading.Event()
        # Set by a SIGTERM: Celery's consumer may still hand this worker a task (even the one it just sent
        # back); it goes back to the queue for another worker instead of being claimed here.
        self.stopping = threading.Event()
        self._running = 0
        self.count_lock = threading.Lock()
        self.job_watches: set[TaskWatch] = set()  # the jobs running now (guarded by count_lock)
        self.intake = JobIntake(self, self.service.scheduler.background_running)
        self.lost_jobs = LostJobSweep(
            self.jobs,
            self.client,
            self._send_again,
            lease_s=self.lease_s,
            visibility_timeout_s=queue.visibility_timeout_s,
            restore_interval_s=restore,
            released=self.local.job_runner.ended_unrun,  # what a lost job held goes
            running_elsewhere=self.registry.running_jobs,
        )
        self._register_tasks()

    # -- lifecycle ---------------------------------------------------------------------------------------

    def run(self, *, loglevel: str = "INFO") -> int:
        """Load the model, then consume tasks until SIGTERM/SIGINT (running tasks finish first)."""
        for chatty in ("celery.worker.strategy", "celery.app.trace"):
            # At INFO these log every task's arguments: texts and base64 prompt recordings.
            logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))
        self.service.start()
        try:  # kept pieces of jobs that ended while no worker ran them (a shared output folder)
            self.local.job_runner.sweep_pieces()
        except OSError as exc:
            log.warning("could not remove the kept pieces of ended jobs: %s", exc)
        http = self._start_http()
        try:
            self._wait_for_model()
        except BaseException:
            self.service.shutdown()
            if http is not None:
                http.close()
            raise
        beat = threading.Thread(target=self._heartbeat_loop, name="cosyserve-heartbeat", daemon=True)
        beat.start()
        # Room for interactive tasks beside the background ones it runs (their units take turns)
        concurrency = self.service.scheduler.concurrency + self.service.scheduler.background_running
        queues = [celery_app.QUEUE, celery_app.BACKGROUND_QUEUE]
        log.info("worker %s takes up to %d tasks at once from %s", self.name, concurrency, queues)
        celery_signals.worker_shutting_down.connect(self.on_worker_shutting_down, weak=False)
        celery_signals.task_received.connect(self.received.on_received, weak=False)
        worker = self.app.Worker(
            pool="threads",
            concurrency=concurrency,
            queues=queues,
            hostname=self.hostname,
            loglevel=loglevel,
            without_gossip=True,
            without_mingle=True,
            without_heartbeat=True,
            optimization="fair",
        )
        try:
            worker.start()
        finally:
            celery_signals.worker_shutting_down.disconnect(self.on_worker_shutting_down)
            celery_signals.task_received.disconnect(self.received.on_received)
            self._stop.set()
            beat.join(timeout=5.0)
            self._leave()
            self.service.shutdown()
            if http is not None:
                http.close()
        return int(worker.exitcode or 0)

    def on_worker_shutting_down(self, sender: Any = None, **_: Any) -> None:
        """Celery's `worker_shutting_down` (SIGTERM/SIGINT, sent from its signal handler): this worker's
        running jobs go back to the queue instead of holding the shutdown until they end."""
        if sender == self.hostname:
            self.stopping.set()
            self.interrupt_jobs("the worker is shutting down")

    def interrupt_jobs(self, reason: str) -> int:
        """Stop the running jobs so they run again elsewhere (`_claimed` sends their tasks again); how
        many. Only sets their cancel events: safe from a signal handler."""
        with self.count_lock:
            job_ids = {watch.task_id for watch in self.job_watches}
        return self.service.scheduler.cancel_running(reason, only=lambda ticket: ticket.id in job_ids)

    def _start_http(self) -> Any:
        """/health, /ready and /metrics on the server host and port; a port in use is logged, not fatal
        (several workers on one host without their own --port)."""
        from cosyserve.service.distributed.worker_http import WorkerHttp

        server = self.settings.server
        try:
            return WorkerHttp(server.host, server.port, self.readiness, self.service.metrics).start()
        except OSError as exc:
            log.warning(
                "no health/metrics endpoint on %s:%d (%s): pass --port", server.host, server.port, exc
            )
            return None

    def readiness(self) -> dict[str, Any]:
        """The service's readiness plus this worker's name, consumer state and running count."""
        state = self.service.readiness(detailed=False)
        if self._stop.is_set():
            state.update(ready=False, reason="the worker is shutting down")
        return {**state, "role": "worker", "name": self.name, "running": self._running}

    def _wait_for_model(self) -> None:
        deadline = time.monotonic() + MODEL_LOAD_TIMEOUT_S
        while self.service.model_state in ("loading", "restarting"):
            if time.monotonic() > deadline:
                raise ModelDirError("the model did not load within an hour")
            time.sleep(0.2)
        if self.service.model_state != "ready":
            error = self.local.host.load_error or RuntimeError(str(self.service.readiness()["reason"]))
            raise ModelDirError(load_failure_message(self.settings.engine.model, error))

    def _heartbeat_loop(self) -> None:
        interval = max(0.5, self.lease_s / 3)
        while not self._stop.is_set():
            try:
                if self.service.model_state == "ready":
                    self.registry.beat(self.name, self.info(), ttl_s=self.lease_s)
                self.intake.shares.renew(self.lease_s)  # its running jobs count for their keys while it lives
                self.received.renew()  # interactive tasks it took and has not started yet
            except Exception as exc:  # Redis briefly away: API nodes see no heartbeat until it is back
                log.warning("worker heartbeat failed: %s", exc)
            try:
                if self.service.model_state == "ready" and not self.stopping.is_set():
                    self.lost_jobs.maybe_sweep()
            except Exception as exc:  # the database or Redis briefly away: the next beat looks again
                log.warning("looking for jobs whose worker stopped failed: %s", exc)
            try:
                self.deleted.sweep()  # its copies of outputs deleted through an API node
            except Exception as exc:  # Redis briefly away: the next beat looks again
                log.warning("looking for outputs deleted through another node failed: %s", exc)
            self._stop.wait(interval)

    def _leave(self) -> None:
        try:
            self.registry.leave(self.name)
        except Exception as exc:  # pragma: no cover - Redis gone at shutdown: the key expires anyway
            log.warning("could not remove the worker heartbeat: %s", exc)

    def info(self) -> dict[str, Any]:
        """What API nodes show about this worker (its heartbeat)."""
        return {
            **self.local.model_info,
            "name": self.name,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "concurrency": self.service.scheduler.concurrency,
            "running": self._running,
            "jobs": self.running_job_ids(),  # whose leases no other host's clock may take for over
        }

    def running_job_ids(self) -> list[str]:
        """The jobs (long texts, batches, dubs) an attempt runs on this worker now."""
        with self.count_lock:
            return sorted(watch.task_id for watch in self.job_watches)

    # -- tasks -------------------------------------------------------------------------------------------

    def _register_tasks(self) -> None:
        handlers = {
            celery_app.TTS_TASK: self._tts_task,
            celery_app.JOB_TASK: self._job_task,
            celery_app.ENROL_TASK: self._enrol_task,
            celery_app.BATCH_TASK: self._batch_task,
        }
        for name, handler in handlers.items():
            self.app.task(**celery_app.task_options(name))(_task_body(self, name, handler))

    def _tts_task(
        self, task: Any, request_data: dict[str, Any], spec_data: dict[str, Any], stream: bool
    ) -> None:
        task_id = task.request.id

        def run(watch: TaskWatch) -> None:
            request = wire.decode_request(request_data)
            spec = wire.decode_spec(spec_data, self._key)
            if not stream:
                ticket = watch.attach(self.local.submit_tts(request, spec))
                self.relay.publish(task_id, "done", wire.encode_outcome(ticket.result()))
                return
            audio = self.local.stream_tts(request, spec)
            watch.attach(audio.ticket)
            self.relay.publish(task_id, "start", wire.encode_stream_start(audio.open()))
            for data in audio.chunks():
                self.relay.publish(task_id, "chunk", data)
            self.relay.publish(task_id, "done", wire.encode_outcome(audio.ticket.result()))

        self._interactive(task_id, run)

    def _enrol_task(self, task: Any, *args: Any) -> None:
        task_id = task.request.id
        enrolment = wire.decode_enrolment(*args)  # a TypeError: arguments this worker cannot take

        def run(watch: TaskWatch) -> None:
            voice = watch.attach(self.local.submit_enrolment(enrolment)).result()
            self.relay.publish(task_id, "done", {"id": voice.id})

        self._interactive(task_id, run)

    def _interactive(self, task_id: str, run: Any) -> None:
        """Run an interactive task under a relay lease; every failure reaches the waiting API node."""
        self.relay.hold(task_id, self.name, self.lease_s)
        self.received.started(task_id)
        try:
            reason = self.relay.cancel_reason(task_id)
            if reason is not None:  # cancelled (or timed out, or given up for lost) while it waited
                self.relay.publish(task_id, "error", wire.encode_error(Cancelled(reason)))
                return
            with self.counted(), TaskWatch(self, task_id, progress=True) as watch:
                run(watch)
        except BaseException as exc:
            if not isinstance(exc, CosyServeError):
                log_failure("worker", f"task {task_id} failed: {exc}", exc=exc)
            self._publish_quietly(task_id, "error", wire.encode_error(exc))
        finally:
            self.relay.release(task_id)

    def _job_task(
        self, task: Any, job_id: str, request_data: dict[str, Any], spec_data: dict[str, Any]
    ) -> None:
        def run(attempt: int) -> Ticket:
            request = wire.decode_request(request_data)
            spec = wire.decode_spec(spec_data, self._key)
            return self.local.run_claimed_job(job_id, attempt, request, spec)

        self._claimed(task, job_id, run)

    def _batch_task(self, task: Any, job_id: str) -> None:
        """A batch or a dub: everything it needs is in the shared database (its row and items)."""
        self._claimed(task, job_id, lambda attempt: self.local.run_claimed_batch(job_id, attempt))

    def _send_again(self, record: JobRecord) -> None:
        """A batch's or a dub's task, sent again for a job whose worker stopped (`lost_jobs.py`)."""
        task = celery_app.BATCH_TASK
        queue = celery_app.queue_of(task)
        send = lambda: self.app.send_task(task, args=[record.id], task_id=record.id, queue=queue)  # noqa: E731
        self.intake.shares.send_counted(record.id, share_key(record.owner), send)

    def _claimed(self, task: Any, job_id: str, run: Any) -> None:
        """A background task: taken within this worker's slots and its key's share, claimed, run."""
        self.intake.claimed(task, job_id, run)

    # -- helpers -----------------------------------------------------------------------------------------

    def _key(self, key_id: int) -> ApiKey | None:
        try:
            return self.service.keys.get(key_id)
        except CosyServeError:  # revoked or deleted since: nothing to charge
            return None

    def _publish_quietly(self, task_id: str, kind: str, data: dict[str, Any]) -> None:
        try:
            self.relay.publish(task_id, kind, data)
        except Exception as exc:  # the API node will see the lease vanish and answer 503
            log.warning("could not report the end of task %s: %s", task_id, exc)

    def counted(self) -> Any:
        """A `with` block during which a task counts among those running here (readiness, heartbeat)."""
        node = self

        class _Counter:
            def __enter__(self) -> None:
                with node.count_lock:
                    node._running += 1

            def __exit__(self, *_exc: object) -> None:
                with node.count_lock:
                    node._running -= 1

        return _Counter()


def _task_body(node: WorkerNode, name: str, handler: Any) -> Any:
    """A Celery task function for `handler`: arguments an older or newer API node sent that this worker
    cannot take end the task with an error the waiting client sees, instead of a silent timeout."""

    def body(task: Any, *args: Any) -> None:
        try:
            handler(task, *args)
        except TypeError as exc:
            if name == celery_app.JOB_TASK:
                if args:
                    with contextlib.suppress(Exception):
                        node.service.jobs.finish_failed(
                            str(args[0]), "incompatible", f"incompatible task: {exc}"
                        )
                raise
            log_failure(
                "worker", f"task {task.request.id} ({name}) has arguments this worker cannot take: {exc}"
            )
            node._publish_quietly(
                task.request.id, "error", wire.encode_error(wire.RemoteFailure(f"incompatible task: {exc}"))
            )

    body.__name__ = body.__qualname__ = name.replace(".", "_")
    return body
