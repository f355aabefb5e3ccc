"""Stopping `serve` without dropping work: on SIGTERM the server keeps listening while its work drains.

uvicorn alone closes its listening socket at the first signal, so a client that connects a moment later
gets a refused connection (or, on a kept-alive connection, a request that waits for nothing). Here the
first SIGTERM/SIGINT stops the scheduler from taking work — every new request is answered at once with
503 `shutting_down` (and `/ready` turns false, so a load balancer moves on) — lets running work finish
within the grace period (then cancels it), and only then lets uvicorn close the connections and run the
app's shutdown. A second signal stops at once, as uvicorn would.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import FrameType

import uvicorn

log = logging.getLogger("cosyserve.serve")


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first exit signal runs `drain()` (in a thread) before the usual shutdown."""

    def __init__(self, config: uvicorn.Config, drain: Callable[[], object]) -> None:
        super().__init__(config)
        self._drain = drain
        self._draining = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or self.should_exit:
            super().handle_exit(sig, frame)  # a second signal: stop now
            return
        self._draining = True
        log.info("signal %d: taking no new work, letting running work finish", sig)
        threading.Thread(
            target=self._drain_then_exit, args=(sig,), name="cosyserve-drain", daemon=True
        ).start()

    def _drain_then_exit(self, sig: int) -> None:
        try:
            self._drain()
        except Exception:  # never keep the process up because draining failed
            log.exception("draining before shutdown failed")
        finally:
            super().handle_exit(sig, None)  # uvicorn's shutdown (it re-raises the signal at the end)
