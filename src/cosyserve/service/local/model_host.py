"""The model this process serves: loaded in a background thread, reloaded on request, lent to running work.

Loading happens off the request path, so `/health` answers at once and `readiness()` turns ready when the
model is loaded. `restart()` waits for running work to let go of the model, frees its memory and loads it
again; work that starts while the model reloads waits for the new one instead of failing
(`synthesizer()`). Consecutive unexpected engine failures (bugs, out of memory) make the host unready
until a synthesis succeeds again.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from cosyserve.errors import Cancelled, CosyServeError, ModelNotReady, SettingsError
from cosyserve.service.local.loading import SynthesizerFactory
from cosyserve.service.local.synthesizer import Synthesizer
from cosyserve.service.logs import log_failure
from cosyserve.service.metrics import Metrics
from cosyserve.service.scheduling.work_context import WorkContext
from cosyserve.service.settings import Settings
from cosyserve.service.startup_clock import StartupClock
from cosyserve.service.stores.voices import VoiceLibrary

log = logging.getLogger(__name__)

ENGINE_FAILURE_LIMIT = 3  # consecutive unexpected synthesis failures before readiness turns false
MODEL_WAIT_S = 600.0  # how long queued work waits for a reloading model
STATES = ("stopped", "loading", "ready", "failed", "restarting")


class ModelHost:
    """Owns the loaded `Synthesizer`: its state (one of STATES), its description (`info`) and its users."""

    def __init__(
        self,
        settings: Settings,
        voices: VoiceLibrary,
        metrics: Metrics,
        *,
        factory: SynthesizerFactory,
        device_type: str,
        release_wait_s: float,
        startup: StartupClock,
        cancel_running: Callable[..., object] = lambda reason, only=None: None,
    ) -> None:
        self.settings = settings
        self.voices = voices
        self.metrics = metrics
        self.device_type = device_type
        self.release_wait_s = release_wait_s  # how long a reload waits for running work to finish
        self._factory = factory
        self.startup = startup
        self._cancel_running = cancel_running  # asks running work to stop (a restart that can't wait)
        self._lock = threading.Condition()
        self._synth: Synthesizer | None = None
        self._state = "stopped"
        self._error: str | None = None
        self.load_error: BaseException | None = None  # why the last load failed (start-up reports it)
        self._users = 0  # running work holding the synthesizer
        self._holders: collections.Counter[threading.Event] = collections.Counter()  # their cancel events
        self._failures = 0
        self._last_failure: str | None = None
        self.info: dict[str, Any] = {"model": settings.engine.model, "device": settings.engine.device}

    # -- state ---------------------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        return self._state

    @property
    def loaded(self) -> Synthesizer | None:
        """The synthesizer while one is loaded (for inspection; work borrows it with `synthesizer()`)."""
        return self._synth

    def readiness(self, detailed: bool = False, *, accepting: bool = True) -> dict[str, Any]:
        """{"ready": bool, "state": ..., "reason": why not ready (or None), model info}; `detailed` adds
        what only admins see (the model's path, the last engine failure)."""
        with self._lock:
            state, error = self._state, self._error
        reason = None
        if state == "failed":
            reason = f"the model failed to load: {error}"
        elif state != "ready":
            reason = f"the model is {state}"
        elif self._failures >= ENGINE_FAILURE_LIMIT:
            reason = f"the engine failed {self._failures} times in a row (the server log has why)"
        elif not accepting:
            reason = "the server is shutting down"
        info = {k: v for k, v in self.info.items() if detailed or k != "model_path"}
        if detailed:
            info["last_engine_failure"] = self._last_failure
        return {"ready": reason is None, "state": state, "reason": reason, **info}

    def require_ready(self) -> None:
        """Raise ModelNotReady unless the model can take work (during a restart, work waits for it)."""
        with self._lock:
            state, error = self._state, self._error
        if state in ("ready", "restarting"):
            return
        if state == "loading":
            raise ModelNotReady("the model is still loading: retry in a few seconds (GET /ready says when)")
        raise ModelNotReady(f"the model is not available ({state}): {error or 'see GET /ready'}")

    def note_result(self, error: BaseException | None) -> None:
        """Count consecutive unexpected failures (bugs, out of memory), which make the host unready."""
        if error is None:
            self._failures = 0
        elif not isinstance(error, CosyServeError):
            self._failures += 1
            self._last_failure = f"{type(error).__name__}: {error}"

    # -- loading -------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin loading in the background, unless a load began already (`serve` starts it early, so that
        the model loads while the web UI's imports run)."""
        with self._lock:
            if self._state == "stopped":
                self._begin_load_locked("loading")

    def restart(self) -> str:
        """Reload the model (freeing its memory first); returns the new state. Idempotent while reloading."""
        with self._lock:
            if self._state in ("loading", "restarting"):
                return self._state
            self._synth = None
            self._begin_load_locked("restarting")
        return "restarting"

    def stop(self) -> None:
        """Drop the model; a load still running finds the host stopped and discards its result."""
        with self._lock:
            self._synth, self._state = None, "stopped"
            self._lock.notify_all()
        self.metrics.set_model_loaded(False)

    def _begin_load_locked(self, state: str) -> None:
        self._state, self._error = state, None
        self._lock.notify_all()
        self.metrics.set_model_loaded(False)
        threading.Thread(target=self._load, name="cosyserve-model-loader", daemon=True).start()

    def _load(self) -> None:
        started = time.perf_counter()
        try:
            self._release_old_model()
            started = time.perf_counter()
            synth = self._factory(self.settings, self.voices)
            if synth.voices is not self.voices:  # the factory's contract: voices and limits are passed in
                raise SettingsError("the synthesizer factory did not use the voice library it was given")
        except Exception as exc:
            log_failure("model_load", f"loading {self.settings.engine.model} failed: {exc}", exc=exc)
            with self._lock:
                self._state, self._error = "failed", str(exc) or type(exc).__name__
                self.load_error = exc
                self._lock.notify_all()
            return
        self.voices.model_checksum = synth.model_dir.fingerprint
        self.info = self._describe(synth, time.perf_counter() - started)
        with self._lock:
            if self._state == "stopped":  # shut down while loading
                return
            self._synth, self._state, self._failures = synth, "ready", 0
            self._lock.notify_all()
        self.metrics.set_model_loaded(True)
        self.startup.mark("model ready", load_s=self.info["load_seconds"])
        if self.info["demo"]:
            log.warning("serving the demo model: random weights, its audio is noise")
        log.info("model ready", extra={k: v for k, v in self.info.items() if k != "model"})

    def _release_old_model(self) -> None:
        """Before a (re)load: wait for running work to let go of the old model — asking it to stop once
        the grace period is over — and free its memory, so two models are never held at once. Raises
        ModelNotReady if the work does not let go (the old model is then still in memory)."""
        with self._lock:
            if not self._lock.wait_for(lambda: self._users == 0, timeout=self.release_wait_s):
                log.warning("engine restart: asking %d running requests to stop", self._users)
                # only the work holding the old model: work waiting for the new one (accepted before or
                # during the restart) goes on waiting, as the README and the Admin tab promise
                holders = set(self._holders)
                self._cancel_running(
                    "the engine is restarting", only=lambda ticket: ticket.cancel_event in holders
                )
                if not self._lock.wait_for(lambda: self._users == 0, timeout=self.release_wait_s):
                    raise ModelNotReady(
                        f"{self._users} running requests did not let go of the old model within "
                        f"{2 * self.release_wait_s:.0f} s, so no second copy was loaded: try the restart "
                        "again, or restart the process"
                    )
        gc.collect()
        if self.device_type == "cuda":  # inside the caller's try: a broken CUDA context fails the load
            import torch

            torch.cuda.empty_cache()

    def _describe(self, synth: Synthesizer, load_seconds: float) -> dict[str, Any]:
        from cosyserve.modeldir.demo_model import is_demo_model

        engine = self.settings.engine
        return {
            "model": engine.model,
            "model_path": str(synth.model_dir.path),
            "fingerprint": synth.model_dir.fingerprint,
            "device": str(synth.engine.placement.device),
            "sample_rate": synth.sample_rate,
            "demo": is_demo_model(synth.model_dir.path),
            "preset": engine.preset,
            "flow_steps": engine.flow_steps,
            "flow_guidance": engine.flow_guidance,
            "precision": synth.engine.placement.dtype_name,
            "dtypes": synth.engine.dtypes(),  # what each part computes in (float16 on a GPU by default)
            "load_seconds": round(load_seconds, 2),
        }

    # -- lending -------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def synthesizer(
        self, cancel: threading.Event | None = None, *, work: WorkContext | None = None
    ) -> Iterator[Synthesizer]:
        """The loaded synthesizer for one piece of work; waits while the model reloads.

        `work`: the borrower's context (its cancel event, unless `cancel` is given). While the model
        reloads it waits without its engine slot: the reload waits for work still holding the old model,
        and that work may need the slot to finish (a long-text job between segments); otherwise each
        would wait for the other until the restart's grace period ran out.
        """
        if cancel is None and work is not None:
            cancel = work.cancel
        deadline = time.monotonic() + MODEL_WAIT_S
        while True:
            with self._lock:
                if self._synth is not None:
                    synth = self._synth
                    self._users += 1
                    if cancel is not None:
                        self._holders[cancel] += 1
                    break
                if work is None:
                    self._wait_for_model_locked(cancel, deadline)
                    continue
            work.without_slot(lambda: self._wait_for_model(cancel, deadline))
        try:
            yield synth
        finally:
            with self._lock:
                self._users -= 1
                if cancel is not None:
                    self._holders[cancel] -= 1
                    if self._holders[cancel] <= 0:
                        del self._holders[cancel]
                self._lock.notify_all()

    def _wait_for_model(self, cancel: threading.Event | None, deadline: float) -> None:
        """Until a model is loaded; ModelNotReady when the load failed or took too long, Cancelled."""
        with self._lock:
            while self._synth is None:
                self._wait_for_model_locked(cancel, deadline)

    def _wait_for_model_locked(self, cancel: threading.Event | None, deadline: float) -> None:
        """One wait of at most 0.2 s for a model (the lock held), after checking why it may be pointless."""
        if self._state in ("failed", "stopped"):
            raise ModelNotReady(f"the model is not available ({self._state}): {self._error or ''}")
        if cancel is not None and cancel.is_set():
            raise Cancelled("cancelled while waiting for the model")
        if time.monotonic() > deadline:
            raise ModelNotReady("the model did not finish reloading in time")
        self._lock.wait(0.2)
