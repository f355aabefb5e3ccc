"""Memory for request bodies, bounded by settings rather than by clients.

Every body is capped on its own (the middleware's `max_body_bytes`); `BodyBudget` also caps the bytes of
large bodies being received at once, so a flood of big uploads waits (and then gets 503) instead of
holding them all in memory. Once large bodies are done with, `FreedMemoryReleaser` hands the freed
pages back to the system: glibc keeps freed heap memory in its per-thread arenas otherwise, so a flood
would leave the process hundreds of MB larger for good.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
from typing import Any

SMALL_BODY_BYTES = 1 << 20  # bodies up to this size (almost every API call) are not counted
TRIM_DELAY_S = 0.5  # requests ending within this time share one trim


class BodyBudget:
    """Bytes of large request bodies being received at once, at most `max_bytes` (a body larger than
    that alone is still let through when nothing else is being received)."""

    def __init__(self, max_bytes: int, wait_s: float = 30.0) -> None:
        self.max_bytes = max_bytes
        self.wait_s = wait_s
        self.in_use = 0
        self._room: asyncio.Condition | None = None

    def counts(self, nbytes: int) -> bool:
        return nbytes > SMALL_BODY_BYTES

    async def acquire(self, nbytes: int) -> bool:
        """Reserve `nbytes`; False if there was no room within `wait_s`."""
        room = self._condition()
        async with room:
            try:
                await asyncio.wait_for(room.wait_for(lambda: self._fits(nbytes)), self.wait_s)
            except asyncio.TimeoutError:
                return False
            self.in_use += nbytes
            return True

    async def release(self, nbytes: int) -> None:
        room = self._condition()
        async with room:
            self.in_use = max(0, self.in_use - nbytes)
            room.notify_all()

    def _fits(self, nbytes: int) -> bool:
        return self.in_use == 0 or self.in_use + nbytes <= self.max_bytes

    def _condition(self) -> asyncio.Condition:
        if self._room is None:  # made on first use, inside the server's event loop
            self._room = asyncio.Condition()
        return self._room


class FreedMemoryReleaser:
    """Collects cyclic garbage and calls glibc's `malloc_trim(0)` shortly after large bodies were
    handled: many requests ending together share one call, made off the event loop (the trim is a no-op
    where glibc isn't the allocator)."""

    def __init__(self, delay_s: float = TRIM_DELAY_S) -> None:
        self.delay_s = delay_s
        self.calls = 0
        self._pending = False
        self._trim = _malloc_trim()

    def soon(self) -> None:
        """From the event loop: trim once, `delay_s` from now (unless one is already planned)."""
        if self._trim is None or self._pending:
            return
        self._pending = True
        loop = asyncio.get_running_loop()
        loop.call_later(self.delay_s, lambda: loop.run_in_executor(None, self._run))

    def _run(self) -> None:
        self._pending = False
        # A failed request's error can keep its body alive in a reference cycle (exception, traceback,
        # frame) until the cycle collector runs, which large buffers alone never trigger: collect first.
        gc.collect()
        if self._trim is not None:
            self._trim(0)
            self.calls += 1


def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None)
