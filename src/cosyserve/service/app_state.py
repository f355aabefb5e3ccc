"""The running service: settings, the resident model, scheduler, stores, auth and metrics in one object.

The API layer talks to this object only (never to the engine). The model is loaded in a background
thread, so `/health` answers at once and `/ready` turns true when loading is done; `restart_engine`
waits for running work to let go of the model, frees its memory and loads it again. Work that starts
while the model reloads waits for the new one instead of failing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cosyserve.errors import Cancelled, CosyServeError, InputError, SettingsError
from cosyserve.service import signing
from cosyserve.service.app_tasks import ServiceTasks
from cosyserve.service.auth import ApiKey, KeyStore, QuotaTracker, RateLimiter, SessionTokens, check_password
from cosyserve.service.db import make_engine, metadata
from cosyserve.service.jobs import JobStore
from cosyserve.service.logs import log_failure
from cosyserve.service.metrics import Metrics
from cosyserve.service.s3sync import S3Sync
from cosyserve.service.scheduler import Scheduler
from cosyserve.service.settings import Settings
from cosyserve.service.startup_clock import StartupClock
from cosyserve.service.storage import OutputStore, RetentionWorker
from cosyserve.service.synthesizer import Synthesizer
from cosyserve.service.voices import VoiceLibrary

if TYPE_CHECKING:
    from cosyserve.service.distributed.dispatch import RemoteDispatcher

log = logging.getLogger(__name__)
ROLES = ("single", "api", "worker")  # one process does it all; an API node; a `cosyserve worker`
REMOTE_IN_FLIGHT = 64  # requests an API node relays at once unless queue.concurrency says otherwise

ENGINE_FAILURE_LIMIT = 3  # consecutive unexpected synthesis failures before /ready turns false
AUTH_CACHE_S = 2.0  # how long "does any API key exist?" is cached (keys are made by another process)
MODEL_WAIT_S = 600.0  # how long queued work waits for a reloading model


class ModelNotReady(CosyServeError):
    """The model is still loading, reloading, or failed to load."""

    retry_after_s = 5


class AuthRequired(CosyServeError):
    """No valid credentials (API key or UI session) came with a request that needs them."""


class Forbidden(CosyServeError):
    """The credentials are valid but not allowed to do this (role or owner)."""


class RateLimited(CosyServeError):
    """Too many requests for this API key; retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QuotaExceeded(RateLimited):
    """The key's daily audio-seconds quota is used up."""


@dataclass(frozen=True)
class Principal:
    """Who is calling: `anonymous` (auth off), an API `key`, or a UI `session` user; or a `signed` URL."""

    kind: str
    role: str  # "admin" or "user"
    key: ApiKey | None = None
    name: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def owner(self) -> str | None:
        """What jobs and outputs record as their owner (None: no owner, visible to everyone)."""
        if self.key is not None:
            return f"key:{self.key.id}"
        if self.kind == "session" and self.name:
            return f"user:{self.name}"
        return None


SynthesizerFactory = Callable[[Settings, VoiceLibrary], Synthesizer]


def load_synthesizer(settings: Settings, voices: VoiceLibrary) -> Synthesizer:
    """Resolve `settings.engine.model` (downloading or writing the demo model if needed) and load it."""
    from cosyserve.engine.device import resolve_placement
    from cosyserve.modeldir.resolve import resolve_model

    engine = settings.engine
    resolve_placement(engine.device, engine.precision)  # a device that isn't there fails before a download
    model_dir = resolve_model(
        engine.model, models_root=engine.models_dir, retry_budget_s=engine.download_retry_s
    )
    synth = Synthesizer.load(
        model_dir,
        device=engine.device,
        precision=engine.precision,
        threads=engine.threads,
        voices=voices,
        max_text_chars=settings.limits.max_text_chars,
        engine_options=engine_options(settings),
    )
    if engine.preset != "exact":
        from types import SimpleNamespace

        from cosyserve.engine.quantize import apply_preset

        networks = SimpleNamespace(llm=synth.engine.lm.model, flow=synth.engine.token2wav.flow)
        log.info("compute preset: %s", apply_preset(networks, engine.preset, measure=False).label)
    return synth


def engine_options(settings: Settings) -> Any:
    """How the engine runs for these settings: batching/CUDA graphs on a GPU (unless turned off) and
    the flow speed options, which change the audio and are logged as such."""
    from cosyserve.engine.pipeline import EngineOptions

    engine = settings.engine
    kind = device_type(engine.device)
    options = EngineOptions()
    if engine.gpu_batching:
        options = EngineOptions.for_device(kind, settings.resolve_concurrency(kind))
    if engine.flow_steps != options.flow_steps or not engine.flow_guidance:
        log.warning(
            "flow speed options are on (%d steps, guidance %s): the audio differs from the official "
            "outputs (`cosyserve bench --flow-steps/--no-cfg` reports by how much)",
            engine.flow_steps,
            "on" if engine.flow_guidance else "off",
        )
    return dataclasses.replace(options, flow_steps=engine.flow_steps, guidance=engine.flow_guidance)


def device_type(spec: str) -> str:
    """ "cpu" or "cuda" for a device setting (auto: CUDA when present)."""
    if spec.startswith("cuda"):
        return "cuda"
    if spec == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cpu"


class Service(ServiceTasks):
    """Everything one server process runs. `start()` before serving, `shutdown()` at the end."""

    def __init__(
        self,
        settings: Settings,
        *,
        synthesizer_factory: SynthesizerFactory | None = None,
        metrics: Metrics | None = None,
        shutdown_grace_s: float | None = None,
        retention_interval_s: float = 3600.0,
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
        self.startup = StartupClock()
        self.shutdown_grace_s = (
            min(30.0, s.queue.request_timeout_s) if shutdown_grace_s is None else shutdown_grace_s
        )
        self.db = make_engine(s.storage.database_url or "")
        self.jobs = JobStore(self.db)
        self.keys = KeyStore(self.db, metadata)
        self.quota = QuotaTracker(self.db, metadata, default_daily_seconds=s.limits.daily_audio_seconds_quota)
        self.rate_limiter = RateLimiter(s.limits.rate_limit_per_minute)
        self.voices = VoiceLibrary(s.storage.data_dir / "voices", self.db, metadata, model_checksum="")
        self.s3 = self._make_s3() if s.s3.sync else None
        assert s.storage.output_dir is not None  # Settings derives it
        self.outputs = OutputStore(
            s.storage.output_dir,
            retention_days=s.storage.retention_days,
            max_total_bytes=int(s.storage.retention_max_gb * 1e9),
            sync=self.s3,
        )
        self.retention = RetentionWorker(self.outputs, retention_interval_s)
        self.signing_secret = s.resolve_signing_secret().get_secret_value()
        self.sessions = SessionTokens(self.signing_secret)
        self.device_type = device_type(s.engine.device)
        # An API node's "slots" are requests it relays to workers, not syntheses of its own.
        concurrency = (
            s.queue.concurrency or REMOTE_IN_FLIGHT
            if role == "api"
            else s.resolve_concurrency(self.device_type)
        )
        self.scheduler = Scheduler(
            concurrency,
            s.queue.queue_size,
            s.queue.request_timeout_s,
            self.metrics,
        )
        self._factory = synthesizer_factory or load_synthesizer
        self._model = threading.Condition()
        self._synth: Synthesizer | None = None
        self._state = "stopped"  # stopped, loading, ready, failed, restarting
        self._model_error: str | None = None
        self.load_error: BaseException | None = None  # why the last load failed (start-up reports it)
        self._users = 0  # running work holding the synthesizer
        self._failures = 0
        self._last_failure: str | None = None
        self.model_info: dict[str, Any] = {"model": s.engine.model, "device": s.engine.device}
        self._auth_cache: tuple[float, bool] = (0.0, False)
        self.remote: RemoteDispatcher | None = None
        if role == "api":
            from cosyserve.service.distributed.dispatch import RemoteDispatcher

            self.remote = RemoteDispatcher(self)

    def _make_s3(self) -> S3Sync:
        cfg = self.settings.s3
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

    # -- lifecycle ---------------------------------------------------------------------------------------

    def check_startup_safety(self) -> list[str]:
        """Refuse (SettingsError) a reachable address with no authentication; warnings to log otherwise."""
        return self.settings.check_startup_safety(self._any_key(), self.settings.auth.ui_login_configured)

    def start(self) -> None:
        if self.role == "single":  # with several nodes, queued and running jobs belong to the workers
            recovered = self.jobs.recover_interrupted()
            if recovered:
                log.warning(
                    "%d jobs left queued or running by an earlier process were marked failed", recovered
                )
        self.retention.start()
        try:  # voices enrolled before files were shared through the database; copies of deleted ones
            self.voices.share_local_files()
            self.voices.prune_local()
        except Exception as exc:
            log_failure("voices", f"sharing or pruning local voice files failed: {exc}", exc=exc)
        if self.s3 is not None:
            try:
                self.s3.prepare()
            except CosyServeError as exc:
                log_failure("s3", f"S3 sync is on but the bucket can't be used: {exc}", exc=exc)
        if self.remote is not None:
            self.remote.start()
            return
        self.preload()

    def preload(self) -> None:
        """Start loading the model now (in the background), if this process runs one and hasn't yet:
        `serve` calls it before importing the web UI, so the two overlap."""
        if self.remote is None:
            with self._model:
                if self._state == "stopped":
                    self._begin_load_locked("loading")

    def shutdown(self) -> dict[str, int]:
        """Stop taking work, let running work finish for the grace period, fail the rest; stop the workers."""
        counts = self.scheduler.shutdown(self.shutdown_grace_s)
        log.info("scheduler stopped: %s", counts)
        self.retention.stop(timeout=5.0)
        if self.s3 is not None:
            self.s3.close(timeout=10.0)
        with self._model:
            self._synth, self._state = None, "stopped"
            self._model.notify_all()
        self.metrics.set_model_loaded(False)
        if self.remote is not None:
            self.remote.close()
        self.db.dispose()
        return counts

    # -- the model ---------------------------------------------------------------------------------------

    @property
    def model_state(self) -> str:
        return self._state

    def readiness(self, detailed: bool = False) -> dict[str, Any]:
        """{"ready": bool, "state": ..., "reason": why not ready (or None), model info}; `detailed` adds
        what only admins see (the model's path, the last engine failure)."""
        if self.remote is not None:
            return self.remote.readiness(detailed, accepting=self.scheduler.accepting)
        with self._model:
            state, error = self._state, self._model_error
        reason = None
        if state == "failed":
            reason = f"the model failed to load: {error}"
        elif state != "ready":
            reason = f"the model is {state}"
        elif self._failures >= ENGINE_FAILURE_LIMIT:
            reason = f"the engine failed {self._failures} times in a row (the server log has why)"
        ready = reason is None and self.scheduler.accepting
        if ready is False and reason is None:
            reason = "the server is shutting down"
        info = {k: v for k, v in self.model_info.items() if detailed or k != "model_path"}
        if detailed:
            info["last_engine_failure"] = self._last_failure
        return {"ready": ready, "state": state, "reason": reason, **info}

    def require_ready(self) -> None:
        """Raise ModelNotReady unless the model can take work (during a restart, work waits for it)."""
        if self.remote is not None:
            self.remote.require_ready()
            return
        with self._model:
            state, error = self._state, self._model_error
        if state in ("ready", "restarting"):
            return
        if state == "loading":
            raise ModelNotReady("the model is still loading: retry in a few seconds (GET /ready says when)")
        raise ModelNotReady(f"the model is not available ({state}): {error or 'see GET /ready'}")

    def restart_engine(self) -> str:
        """Reload the model (freeing its memory first); returns the new state. Idempotent while reloading."""
        if self.remote is not None:
            raise InputError(
                "this API node runs no model: restart the `cosyserve worker` processes instead "
                "(one at a time; their jobs move to the others)"
            )
        with self._model:
            if self._state in ("loading", "restarting"):
                return self._state
            self._synth = None
            self._begin_load_locked("restarting")
        return "restarting"

    def _begin_load(self, state: str) -> None:
        with self._model:
            self._begin_load_locked(state)

    def _begin_load_locked(self, state: str) -> None:
        self._state, self._model_error = state, None
        self._model.notify_all()
        self.metrics.set_model_loaded(False)
        threading.Thread(target=self._load, name="cosyserve-model-loader", daemon=True).start()

    def _load(self) -> None:
        with self._model:  # a restart first waits for running work to let go of the old model
            self._model.wait_for(lambda: self._users == 0, timeout=self.shutdown_grace_s)
        gc.collect()
        if self.device_type == "cuda":
            import torch

            torch.cuda.empty_cache()
        started = time.perf_counter()
        try:
            synth = self._factory(self.settings, self.voices)
        except Exception as exc:
            log_failure("model_load", f"loading {self.settings.engine.model} failed: {exc}", exc=exc)
            with self._model:
                self._state, self._model_error = "failed", str(exc) or type(exc).__name__
                self.load_error = exc
                self._model.notify_all()
            return
        synth.voices = self.voices  # whatever the factory did: this service's library and limits
        synth.max_text_chars = self.settings.limits.max_text_chars
        self.voices.model_checksum = synth.model_dir.fingerprint
        from cosyserve.modeldir.demo_model import is_demo_model

        self.model_info = {
            "model": self.settings.engine.model,
            "model_path": str(synth.model_dir.path),
            "fingerprint": synth.model_dir.fingerprint,
            "device": str(synth.engine.placement.device),
            "sample_rate": synth.sample_rate,
            "demo": is_demo_model(synth.model_dir.path),
            "preset": self.settings.engine.preset,
            "flow_steps": self.settings.engine.flow_steps,
            "flow_guidance": self.settings.engine.flow_guidance,
            "load_seconds": round(time.perf_counter() - started, 2),
        }
        with self._model:
            if self._state == "stopped":  # shut down while loading
                return
            self._synth, self._state, self._failures = synth, "ready", 0
            self._model.notify_all()
        self.metrics.set_model_loaded(True)
        self.startup.mark("model ready", load_s=self.model_info["load_seconds"])
        if self.model_info["demo"]:
            log.warning("serving the demo model: random weights, its audio is noise")
        log.info("model ready", extra={k: v for k, v in self.model_info.items() if k != "model"})

    @contextlib.contextmanager
    def synthesizer(self, cancel: threading.Event | None = None) -> Iterator[Synthesizer]:
        """The loaded synthesizer for one piece of work; waits while the model reloads."""
        deadline = time.monotonic() + MODEL_WAIT_S
        with self._model:
            while self._synth is None:
                if self._state in ("failed", "stopped"):
                    raise ModelNotReady(
                        f"the model is not available ({self._state}): {self._model_error or ''}"
                    )
                if cancel is not None and cancel.is_set():
                    raise Cancelled("cancelled while waiting for the model")
                if time.monotonic() > deadline:
                    raise ModelNotReady("the model did not finish reloading in time")
                self._model.wait(0.2)
            synth = self._synth
            self._users += 1
        try:
            yield synth
        finally:
            with self._model:
                self._users -= 1
                self._model.notify_all()

    def note_engine_result(self, error: BaseException | None) -> None:
        """Count consecutive unexpected failures (bugs, out of memory), which make /ready false."""
        if error is None:
            self._failures = 0
        elif not isinstance(error, CosyServeError):
            self._failures += 1
            self._last_failure = f"{type(error).__name__}: {error}"

    # -- auth --------------------------------------------------------------------------------------------

    def _any_key(self) -> bool:
        return bool(self.keys.list(include_revoked=False))

    def auth_enabled(self) -> bool:
        """Whether requests must authenticate: keys required, any key exists, or a UI login is set."""
        auth = self.settings.auth
        if auth.api_keys_required or auth.ui_login_configured:
            return True
        checked_at, exists = self._auth_cache
        if time.monotonic() - checked_at > AUTH_CACHE_S:
            exists = self._any_key()
            self._auth_cache = (time.monotonic(), exists)
        return exists

    def login(self, username: str, password: str) -> str:
        """A session token for the UI user, or AuthRequired."""
        auth = self.settings.auth
        if not auth.ui_login_configured or auth.ui_password is None:
            raise AuthRequired("no UI login is configured on this server (set ui_username and ui_password)")
        name_ok = check_password(auth.ui_username or "", username or "")
        password_ok = check_password(auth.ui_password.get_secret_value(), password or "")
        if not (name_ok and password_ok):
            raise AuthRequired("wrong user name or password")
        return self.sessions.issue(username)

    def check_rate(self, principal: Principal) -> None:
        if principal.key is None:
            return  # anonymous (auth off) and UI sessions are not rate limited
        wait = self.rate_limiter.acquire(principal.key)
        if wait > 0:
            limit = self.rate_limiter.limit_for(principal.key)
            raise RateLimited(
                f"rate limit of {limit:g} requests per minute reached for this key: retry in {wait:.0f} s",
                max(1, round(wait + 0.5)),
            )

    def check_quota(self, principal: Principal) -> None:
        if principal.key is None:
            return
        status = self.quota.check(principal.key)
        if not status.allowed:
            raise QuotaExceeded(
                f"the daily audio quota of {status.limit_s:g} s is used up ({status.used_s:.1f} s today): "
                "it resets at 00:00 UTC",
                max(1, int(status.resets_at - time.time())),
            )

    def signed_url(self, path: str, query: dict[str, Any] | None = None) -> str:
        """`path?exp=&sig=` (plus `query`), valid for `signed_url_ttl_s` seconds."""
        url = signing.signed_url(path, self.settings.auth.signed_url_ttl_s, self.signing_secret)
        extra = "".join(f"&{k}={v}" for k, v in (query or {}).items() if v is not None)
        return url + extra

    def verify_signed(self, path: str, exp: str | None, sig: str | None) -> bool:
        return signing.verify(path, exp, sig, self.signing_secret)
