"""Redis keys beside the Celery queue: result streams, cancel flags, task leases and the worker registry.

- `cosyserve:out:<task>` is a Redis stream a worker appends a task's output to (`start`, `chunk`,
  `progress`, `done`, `error`); the API node that submitted the task reads it from the beginning, so
  nothing is lost when the reader subscribes late (pub/sub would drop it). Streams expire after `ttl_s`.
- `cosyserve:cancel:<task>` asks whoever runs (or will run) the task to stop.
- `cosyserve:lease:<task>` is held by the worker running an interactive task and renewed while it runs;
  its disappearance before `done`/`error` tells the API node the worker died.
- `cosyserve:worker:<name>` is each worker's heartbeat (what model it serves, its concurrency); an API node
  is ready while at least one is fresh.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from cosyserve.service.wire import from_json, to_json

log = logging.getLogger(__name__)

PREFIX = "cosyserve"
RESULT_TTL_S = 3600  # an unread result stream is dropped after this
MAX_STREAM_ITEMS = 100_000  # a runaway producer cannot fill the broker's memory


@dataclass(frozen=True)
class RelayItem:
    id: str
    kind: str  # start, chunk, progress, done, error
    data: bytes


def connect(url: str, **options: Any) -> Any:
    """A redis-py client for `url` (bytes in, bytes out), with a bounded connect timeout."""
    import redis

    options.setdefault("socket_connect_timeout", 5.0)
    options.setdefault("health_check_interval", 30)
    return redis.Redis.from_url(url, **options)


class Relay:
    """Task output, cancel flags and leases in Redis. Thread-safe (redis-py pools connections)."""

    def __init__(self, client: Any, *, ttl_s: int = RESULT_TTL_S) -> None:
        self.client = client
        self.ttl_s = ttl_s

    # -- output ------------------------------------------------------------------------------------------

    def publish(self, task_id: str, kind: str, data: bytes | dict[str, Any] | float = b"") -> None:
        if not isinstance(data, bytes):
            data = to_json(data)
        key = _key("out", task_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(key, {"k": kind, "d": data}, maxlen=MAX_STREAM_ITEMS, approximate=True)
        pipe.expire(key, self.ttl_s)
        pipe.execute()

    def read(self, task_id: str, after: str = "0-0", block_ms: int = 1000) -> list[RelayItem]:
        """Items after `after` (the last item id seen), waiting up to `block_ms` for the first (0: not
        at all; Redis itself reads BLOCK 0 as "forever")."""
        block = block_ms if block_ms > 0 else None
        response = self.client.xread({_key("out", task_id): after}, block=block, count=256)
        items = []
        for _stream, entries in response or []:
            for entry_id, fields in entries:
                items.append(RelayItem(_text(entry_id), _text(fields[b"k"]), bytes(fields.get(b"d", b""))))
        return items

    def drop(self, task_id: str) -> None:
        """Forget a task's output (its reader is done with it). A cancel flag stays until it expires: the
        task may still be waiting in the queue, and the worker that takes it must see the flag."""
        self.client.delete(_key("out", task_id))

    # -- cancel flags ------------------------------------------------------------------------------------

    def request_cancel(self, task_id: str, reason: str = "cancelled by the client") -> None:
        self.client.set(_key("cancel", task_id), reason.encode(), ex=self.ttl_s)

    def cancel_reason(self, task_id: str) -> str | None:
        value = self.client.get(_key("cancel", task_id))
        return None if value is None else _text(value)

    # -- leases ------------------------------------------------------------------------------------------

    def hold(self, task_id: str, worker: str, lease_s: float) -> None:
        self.client.set(_key("lease", task_id), worker.encode(), px=max(1, int(lease_s * 1000)))

    def release(self, task_id: str) -> None:
        self.client.delete(_key("lease", task_id))

    def holder(self, task_id: str) -> str | None:
        value = self.client.get(_key("lease", task_id))
        return None if value is None else _text(value)


class WorkerRegistry:
    """Worker heartbeats: each worker refreshes its key; a key that expired is a worker that is gone."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def beat(self, name: str, info: dict[str, Any], ttl_s: float) -> None:
        self.client.set(_key("worker", name), to_json(info), px=max(1, int(ttl_s * 1000)))

    def leave(self, name: str) -> None:
        self.client.delete(_key("worker", name))

    def alive(self) -> list[dict[str, Any]]:
        """The info of every worker whose heartbeat is fresh, by name."""
        keys = sorted(self.client.scan_iter(match=_key("worker", "*"), count=100))
        if not keys:
            return []
        workers = []
        for key, value in zip(keys, self.client.mget(keys), strict=True):
            if value is None:  # expired between SCAN and MGET
                continue
            try:
                info = from_json(value)
            except ValueError:
                log.warning("ignoring a malformed worker heartbeat at %s", _text(key))
                continue
            info.setdefault("name", _text(key).split(":", 2)[-1])
            workers.append(info)
        return workers

    def running_jobs(self) -> set[str]:
        """The ids of the jobs live workers say they run (in their heartbeats)."""
        return {str(job) for info in self.alive() for job in info.get("jobs") or ()}


def _key(kind: str, name: str) -> str:
    return f"{PREFIX}:{kind}:{name}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
