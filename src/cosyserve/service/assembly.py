"""The running service: one object that assembles the parts of a server process, starts and stops them.

The parts, each with one owner: the stores (database, jobs, keys, voices, outputs and their bucket), the
`Access` gate (who is calling, limits, signed links), the scheduler (bounded queue, worker threads), and a
`Backend` chosen once from the role: `LocalBackend` with its `ModelHost` (one process that does it all, or
a `cosyserve worker`), or `RemoteBackend` (an API node that hands work to workers). The API and the UI
talk to these parts through this object, never to the engine.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from cosyserve.errors import CosyServeError, SettingsError
from cosyserve.service.access.gate import Access
from cosyserve.service.backend import Backend
from cosyserve.service.distributed.deleted_outputs import DeletedOutputs
from cosyserve.service.distributed.remote import RemoteBackend
from cosyserve.service.labels.labeller import Labeller
from cosyserve.service.local.backend import LocalBackend
from cosyserve.service.local.loading import SynthesizerFactory, device_type, load_synthesizer
from cosyserve.service.local.model_host import ModelHost
from cosyserve.service.logs import log_failure
from cosyserve.service.metrics import Metrics, SyncCollector
from cosyserve.service.reservations import QuotaReservations
from cosyserve.service.scheduling.fair_policy import FairSettings
from cosyserve.service.scheduling.scheduler import Scheduler
from cosyserve.service.setting_groups import S3Settings
from cosyserve.service.settings import Settings
from cosyserve.service.startup_clock import StartupClock
from cosyserve.service.stores.batches import BatchStore
from cosyserve.service.stores.db import make_engine, metadata, sqlite_damage
from cosyserve.service.stores.jobs import JobStore
from cosyserve.service.stores.keys import ApiKey, KeyStore
from cosyserve.service.stores.output_refs import forget_missing, forget_outputs
from cosyserve.service.stores.output_space import RetentionWorker
from cosyserve.service.stores.output_timezone import output_timezone
from cosyserve.service.stores.outputs import OutputStore
from cosyserve.service.stores.s3sync import S3Sync
from cosyserve.service.stores.voices import VoiceLibrary

log = logging.getLogger(__name__)
ROLES = ("single", "api", "worker")  # one process does it all; an API node; a `cosyserve worker`
REMOTE_IN_FLIGHT = 64  # requests an API node relays at once unless queue.concurrency says otherwise


class Service:
    """Everything one server process runs. `start()` before serving, `shutdown()` at the end."""

    def __init__(
        self,
        settings: Settings,
        *,
        synthesizer_factory: SynthesizerFactory | None = None,
        metrics: Metrics | None = None,
        shutdown_grace_s: float | None = None,
        retention_interval_s: float | None = None,
        role: str = "single",
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        if role != "single" and not settings.queue.queue_url:
            raise SettingsError(f"a {role} node needs queue_url (--queue redis://host:6379/0)")
        self.role = role
        self.settings = s = settings
        self.metrics = metrics or Metrics()
        self.started_at = time.time()
        self.started_mono = time.monotonic()  # uptime: a wall-clock step must not make it negative
        self.startup = StartupClock()  # how long getting ready took, each phase logged once
        self.shutdown_grace_s = (
            min(30.0, s.queue.request_timeout_s) if shutdown_grace_s is None else shutdown_grace_s
        )
        # Stores
        self.db = make_engine(s.storage.database_url or "")
        self.database_problem: str | None = None  # what the check at start found (`_check_stores`)
        self.jobs = JobStore(self.db)
        self.batches = BatchStore(self.db)
        self.keys = KeyStore(self.db, metadata)
        self.voices = VoiceLibrary(s.storage.data_dir / "voices", self.db, metadata, model_checksum="")
        self.voices.max_per_owner = s.limits.max_voices_per_owner
        self.s3 = _s3_sync(s.s3) if s.s3.sync else None
        if self.s3 is not None:
            self.metrics.registry.register(SyncCollector(self.s3))
        if s.storage.output_dir is None:  # pragma: no cover - Settings derives it
            raise SettingsError("storage.output_dir is not set")
        self.labels = Labeller.from_settings(s)  # what every stored or served output is labelled with
        self.outputs = OutputStore(
            s.storage.output_dir,
            retention_days=s.storage.retention_days,
            max_total_bytes=int(s.storage.retention_max_gb * 1e9),
            sync=self.s3,
            zone=output_timezone(s.storage.timezone),
            min_free_bytes=int(s.storage.min_free_mb * 1e6),
            labels=self.labels,
        )
        interval = s.storage.retention_interval_s if retention_interval_s is None else retention_interval_s
        self.retention = RetentionWorker(self.outputs, interval, also=self._purge_old_jobs)
        # Access, scheduling, and the backend the role asks for
        self.access = Access(s, self.keys, self.db)
        self.reservations = QuotaReservations(self.access.quota, self.voices)
        self.device_type = device_type(s.engine.device)
        # An API node's "slots" are requests it relays to workers, not syntheses of its own.
        if role == "api":
            concurrency = s.queue.concurrency or REMOTE_IN_FLIGHT
        else:
            concurrency = s.resolve_concurrency(self.device_type)
        fair = FairSettings(s.queue.background_share, s.queue.background_slots)
        self.scheduler = Scheduler(
            concurrency,
            s.queue.queue_size,
            s.queue.request_timeout_s,
            self.metrics,
            fair=fair,
            background_running=s.queue.background_running,
        )
        self.model: ModelHost | None = None  # the model this process serves (None on an API node)
        self._drain_lock = threading.Lock()
        self._drained: dict[str, int] | None = None
        self._tombstones: DeletedOutputs | None = None
        self.backend: Backend = self._make_backend(synthesizer_factory)
        self.outputs.on_deleted = self._output_deleted
        self.outputs.on_expired = self._output_expired

    def _make_backend(self, factory: SynthesizerFactory | None) -> Backend:
        """The one place the role decides anything: where synthesis runs."""
        if self.role == "api":
            remote = RemoteBackend(
                self.settings,
                self.scheduler,
                jobs=self.jobs,
                voices=self.voices,
                batches=self.batches,
                reservations=self.reservations,
            )
            # the workers that made an output deleted here drop their copies (`deleted_outputs.py`)
            self._tombstones = DeletedOutputs(remote.client)
            return remote
        self.model = ModelHost(
            self.settings,
            self.voices,
            self.metrics,
            factory=factory or load_synthesizer,
            device_type=self.device_type,
            release_wait_s=self.shutdown_grace_s,
            startup=self.startup,
            cancel_running=self.scheduler.cancel_running,
        )
        return LocalBackend(
            host=self.model,
            scheduler=self.scheduler,
            jobs=self.jobs,
            outputs=self.outputs,
            quota=self.access.quota,
            metrics=self.metrics,
            limits=self.settings.limits,
            startup=self.startup,
            # With several nodes, queued and running jobs belong to the workers, not to one process.
            recover_jobs=self.role == "single",
            # A worker uploads before answering: the API node that serves the result reads the bucket.
            upload_outputs=self.role == "worker" and self.s3 is not None,
            batches=self.batches,
            key_lookup=self._key,
            queue=self.settings.queue,
            reservations=self.reservations,
            labels=self.labels,
        )

    def _check_stores(self) -> None:
        """In the background at start: the database's own check (a damaged one makes the server
        unready), then (a single server without a bucket) links to outputs deleted by a version that left
        jobs and items pointing at them."""
        try:
            self.database_problem = sqlite_damage(self.db)
        except Exception as exc:
            log_failure("database", f"checking the database failed: {exc}", exc=exc)
        if self.database_problem:
            log_failure("database", self.database_problem)
            return
        if self.role == "single" and self.outputs.bucket is None:  # every output is here to look at
            self._forget_missing()

    def _forget_missing(self) -> None:
        try:
            forget_missing(self.db, self.outputs.removed_here, self.outputs.has_local)
        except Exception as exc:
            log_failure("outputs", f"clearing links to deleted outputs failed: {exc}", exc=exc)

    def _output_deleted(self, output_id: str) -> None:
        """An output was deleted: as `_output_expired`, and (an API node) the worker that made it drops
        its copy."""
        self._output_expired([output_id])
        if self._tombstones is not None:
            self._tombstones.note_quietly(output_id)

    def _output_expired(self, output_ids: list[str]) -> None:
        """Outputs are gone (deleted, or removed by retention): the jobs and batch items naming them stop
        pointing at them."""
        try:
            forget_outputs(self.db, output_ids)
        except Exception as exc:  # their links then answer 404, as before
            log.warning("could not clear %d removed outputs from jobs and batches: %s", len(output_ids), exc)

    @property
    def uptime_s(self) -> float:
        """Seconds since this service started (the monotonic clock's)."""
        return time.monotonic() - self.started_mono

    def _purge_old_jobs(self) -> None:
        """Records of jobs that ended more than `job_retention_days` ago go, with their texts and items."""
        days = self.settings.storage.job_retention_days
        if days > 0:
            cutoff = datetime.now(timezone.utc) - timedelta(days=days)
            if purged := self.jobs.purge_finished_before(cutoff):
                log.info("removed the records of %d jobs that ended more than %g days ago", purged, days)

    def _key(self, key_id: int) -> ApiKey | None:
        """The key that submitted a job (None once it was revoked or deleted: nothing is charged)."""
        try:
            return self.keys.get(key_id)
        except CosyServeError:
            return None

    # -- lifecycle -----------------------------------------------------------------------------------------

    def check_startup_safety(self) -> list[str]:
        """Refuse (SettingsError) a reachable address with no authentication; warnings to log otherwise."""
        auth = self.settings.auth
        return self.settings.check_startup_safety(self.access.any_key(), auth.ui_login_configured)

    def preload(self) -> None:
        """Start loading the model now, in the background, if this process runs one and hasn't yet:
        `serve` calls it before importing the web UI, so that the two overlap."""
        if self.model is not None:
            self.model.start()

    def start(self) -> None:
        self.retention.start()
        try:  # voices enrolled before files were shared through the database; copies of deleted ones
            self.voices.share_local_files()
            self.voices.prune_local()
        except Exception as exc:
            log_failure("voices", f"sharing or pruning local voice files failed: {exc}", exc=exc)
        # one look at the database and every job's output, in the background (not on the start-up path)
        threading.Thread(target=self._check_stores, name="cosyserve-store-check", daemon=True).start()
        if self.s3 is not None:
            try:
                self.s3.prepare()
            except CosyServeError as exc:
                log_failure("s3", f"S3 sync is on but the bucket can't be used: {exc}", exc=exc)
        self.backend.start()

    def drain(self) -> dict[str, int]:
        """Stop taking work (new requests get 503 `shutting_down`), let running work finish for the grace
        period, then cancel it. Idempotent: later calls return the first call's counts."""
        with self._drain_lock:
            if self._drained is None:
                self._drained = self.scheduler.shutdown(self.shutdown_grace_s)
                log.info("scheduler stopped: %s", self._drained)
            return self._drained

    def shutdown(self) -> dict[str, int]:
        """`drain()`, then stop the parts."""
        counts = self.drain()
        self.retention.stop(timeout=5.0)
        if self.s3 is not None:
            self.s3.close(timeout=10.0)
        self.backend.stop()
        self.db.dispose()
        return counts

    # -- what the server as a whole reports ----------------------------------------------------------------

    @property
    def model_state(self) -> str:
        """The model host's state (stopped, loading, ready, failed, restarting); "stopped" on an API node."""
        return self.model.state if self.model is not None else "stopped"

    def readiness(self, detailed: bool = False) -> dict[str, Any]:
        """{"ready": bool, "state": ..., "reason": why not ready (or None), model info}; `detailed` adds
        what only admins see (the model's path, the last engine failure, the workers)."""
        state = self.backend.readiness(detailed, accepting=self.scheduler.accepting)
        health = self.outputs.health  # results that can't be kept: not ready either
        problem = health.problem() if detailed else health.public_problem()  # (paths: admins only)
        state["storage"] = problem or "ok"
        if problem and state["ready"]:
            state.update(ready=False, reason=f"storage: {problem}")
        if self.database_problem and state["ready"]:
            state.update(ready=False, reason=self.database_problem)
        if self.s3 is not None:  # said, not unready: results are kept here and catch up when it is back
            sync = self.s3.status()
            if not detailed:  # its last error names the endpoint, bucket, prefix and object: admins only
                sync.pop("last_error", None)
            state["s3_sync"] = sync
        return state


def _s3_sync(cfg: S3Settings) -> S3Sync:
    secret = cfg.secret_access_key.get_secret_value() if cfg.secret_access_key else None
    return S3Sync(
        cfg.endpoint_url,
        cfg.bucket or "",
        cfg.prefix,
        region=cfg.region,
        access_key_id=cfg.access_key_id,
        secret_access_key=secret,
        lifecycle_days=cfg.lifecycle_days,
        path_style=cfg.endpoint_url is not None,  # self-hosted endpoints (MinIO, moto) want path style
    )
