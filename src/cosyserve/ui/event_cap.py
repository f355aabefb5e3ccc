"""A cap on the events one user may have waiting in the page's event queue.

Gradio's event queue serves each event handler first come, first served, with no limit per user: a
script that joined thousands of cheap events (a history refresh, a voice list) made every other user's
clicks on them wait behind its own, and grew the queue without bound. `cap_waiting_events` wraps the
queue's `push` so that a user who already has `MAX_WAITING_PER_USER` events waiting (not yet running) is
answered 503 with a message saying so; everyone else's events go on. A page's own load and clicks keep a
handful waiting at most, several tabs a few dozen.

Who a request is comes from the login check (`ui_auth_dependency`), which notes the caller's owner on the
request's state (`note_event_owner`); a request without one (none reaches the queue) is not capped.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import Request

MAX_WAITING_PER_USER = 32
_OWNER_STATE = "cosyserve_event_owner"
TOO_MANY_WAITING = (
    "You already have {limit} actions waiting on this page (in this tab or others): wait for them to "
    "finish, or close tabs you do not use, then try again."
)


def note_event_owner(request: Request, owner: str) -> None:
    """Record who made `request` (an owner such as `key:3`), for the cap."""
    setattr(request.state, _OWNER_STATE, owner)


def event_owner(request: Any) -> str | None:
    state = getattr(request, "state", None)
    return getattr(state, _OWNER_STATE, None) if state is not None else None


def waiting_events(queue: Any) -> Counter[str]:
    """How many events each owner has waiting in Gradio's `queue` (a `gradio.queueing.Queue`)."""
    counts: Counter[str] = Counter()
    for event_queue in queue.event_queue_per_concurrency_id.values():
        for event in event_queue.queue:
            owner = event_owner(event.request)
            if owner is not None:
                counts[owner] += 1
    return counts


def cap_waiting_events(demo: Any, limit: int = MAX_WAITING_PER_USER) -> None:
    """Wrap `demo`'s event queue so that no owner has more than `limit` events waiting."""
    queue = demo._queue
    push = queue.push
    joining: Counter[str] = Counter()  # pushes of each owner under way (push awaits before it queues)

    async def capped_push(body: Any, request: Any, username: str | None) -> tuple[bool, Any, str]:
        owner = event_owner(request)
        if owner is None:
            return await push(body=body, request=request, username=username)
        if waiting_events(queue)[owner] + joining[owner] >= limit:
            return False, TOO_MANY_WAITING.format(limit=limit), "queue_full"
        joining[owner] += 1
        try:
            return await push(body=body, request=request, username=username)
        finally:
            joining[owner] -= 1
            if joining[owner] <= 0:
                del joining[owner]

    queue.push = capped_push
