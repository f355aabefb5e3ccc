"""Long passes stop between their steps once the work they serve is cancelled.

The LM checks its cancel before every token, but a one-shot flow pass (ten solver steps over every frame)
and the vocoder ran to their end: a request cancelled or timed out during them held the engine for
seconds on a GPU and up to a minute on a CPU, while the next request waited. The caller that knows the
cancel sets it for the pass (`interruptible`), and the solver calls `checkpoint()` between its steps: no
argument through every layer, no device sync (a Python flag read). A pass shared by several requests (a
batched flow) runs `uninterruptible`: one request's cancel must not fail the others.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar

from cosyserve.errors import Cancelled

_cancelled: ContextVar[Callable[[], bool] | None] = ContextVar("cosyserve_interrupt", default=None)


@contextlib.contextmanager
def interruptible(cancelled: Callable[[], bool] | threading.Event | None) -> Iterator[None]:
    """Passes run inside raise Cancelled at their next checkpoint once `cancelled()` is true (or the event
    is set; None: never). Use it around code that does not yield: a generator's yield would carry the
    setting out."""
    if isinstance(cancelled, threading.Event):
        cancelled = cancelled.is_set
    token = _cancelled.set(cancelled)
    try:
        yield
    finally:
        _cancelled.reset(token)


def uninterruptible() -> contextlib.AbstractContextManager[None]:
    """A pass other work shares runs to its end whoever's cancel is set."""
    return interruptible(None)


def checkpoint() -> None:
    """Cancelled when the work this pass serves was cancelled; nothing otherwise."""
    cancelled = _cancelled.get()
    if cancelled is not None and cancelled():
        raise Cancelled("the request was cancelled")
