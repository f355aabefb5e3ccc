"""Batched LM decoding across concurrent requests: one forward pass advances every request by a token.

On a GPU a decode step of one request reads every weight to produce one row; several requests in one
step read the weights once. Each request keeps running in its own thread with its own sampler and
generator: it calls `DecodeBatcher.step(member, token)`, which waits until the step can run together
with the other members' steps, runs one batched forward (each row at its own position, with its own
attention mask: `SpeechLM.decode_rows`) and hands each caller its own row of log-probs. A row depends
on its own request only (up to float rounding), so seeded requests draw the same tokens alone or
batched.

The members' KV caches live in one pool, one slot per member: a request prefills alone (its prefix
lengths differ), then `join` copies its cache into a free slot, and `leave` frees the slot (the last
member moves into it, so the members always fill slots `0 .. n-1` and a step reads a plain view).
A slot's positions past its member's length are zeroed whenever it changes hands: the step masks them
out of the scores, but a stale NaN value times its weight 0 would still be NaN.

A batch starts when every member that is keeping up has arrived, when `max_batch` steps wait, or
`window_s` after the first arrival. A member that missed a batch (busy elsewhere: a streaming chunk,
a slow consumer) is not waited for again until it comes back. Members that did not arrive in time
still get a row computed (at the position their next step will overwrite), which keeps the batch a
plain slice of the pool; their state does not change.

`Rendezvous` is the gathering logic alone; `cosyserve.engine.flow_batching` uses it for the flow.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

from cosyserve.engine.device import to_device
from cosyserve.engine.kv_cache import KVCache
from cosyserve.engine.memory import free_cached_memory, is_out_of_memory, out_of_memory
from cosyserve.errors import Cancelled, InputError, OutOfMemory
from cosyserve.model.speech_lm import SpeechLM

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_DECODE_WINDOW_S = 0.002  # a GPU decode step takes ~5-20 ms: waiting 2 ms for stragglers pays


class BatchError(RuntimeError):
    """A batched forward failed (other than by running out of memory: `OutOfMemory`). Raised in the
    thread of every request in that batch; the original exception is its `__cause__`."""


@dataclass(eq=False)
class _Ticket(Generic[T]):
    item: T
    result: Any = None
    error: BaseException | None = None
    done: bool = False


class Rendezvous(Generic[T, R]):
    """Calls from many threads, gathered into batches. `submit(item)` blocks until a batch holding
    `item` has run and returns that item's result.

    The thread that finds a batch ready runs it (`run_batch`, outside the lock); the others wait. A
    batch is ready when `max_batch` items wait, when `all_arrived()` says so, or `window_s` after its
    first item arrived. Subclasses may override the hooks `admit`, `all_arrived`, `batch_started` and
    `batch_finished` (called with the lock held).

    A batch that runs out of accelerator memory does not fail its members: the cache is freed and it
    runs once more (in halves, down to single items, when `split_on_oom`: items are independent); only
    what still does not fit gets `OutOfMemory`, a typed error the service answers with a 503.
    """

    split_on_oom = False  # whether a batch's items may run in separate, smaller batches

    def __init__(self, *, max_batch: int, window_s: float) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if window_s < 0:
            raise ValueError(f"window_s must be >= 0, got {window_s}")
        self.max_batch = max_batch
        self.window_s = window_s
        self._cond = threading.Condition()
        self._pending: list[_Ticket[T]] = []
        self._running = False
        self._round_start: float | None = None
        self.batches = 0  # batches run so far (for tests and metrics)
        self.rows = 0  # items in them

    # ---- hooks ----------------------------------------------------------------------------------
    def admit(self, item: T) -> None:
        """Check `item` as it arrives (lock held); raise to refuse it."""

    def run_batch(self, items: list[T]) -> Sequence[R]:
        """One result per item, in order. Runs without the lock."""
        raise NotImplementedError

    def all_arrived(self, pending: list[T]) -> bool:
        """Whether nobody else is worth waiting for (lock held)."""
        return False

    def batch_started(self, items: list[T]) -> None:
        """Called when `items` are taken for a batch (lock held)."""

    def batch_finished(self, items: list[T], results: Sequence[R] | None) -> None:
        """Called after the batch ran (lock held); `results` is None when it failed."""

    # ---- machinery ------------------------------------------------------------------------------
    def submit(self, item: T) -> R:
        ticket = _Ticket(item)
        with self._cond:
            self.admit(item)
            self._pending.append(ticket)
            if self._round_start is None:
                self._round_start = time.monotonic()
            self._cond.notify_all()
        while True:
            with self._cond:
                batch = self._wait_turn(ticket)
            if batch is None:
                break
            # The batch this thread runs may hold other items only (first come, first served).
            self._execute(batch)
        error = ticket.error
        if error is not None:
            # A fresh exception per thread: one object raised in several threads would share a traceback.
            if isinstance(error, Cancelled):
                raise Cancelled(str(error))
            if isinstance(error, OutOfMemory):
                raise OutOfMemory(str(error), retry_after_s=error.retry_after_s) from error.__cause__
            raise BatchError(f"the batched step failed: {error!r}") from error
        return ticket.result

    def withdraw(self, predicate: Callable[[T], bool], error: BaseException) -> None:
        """Fail the waiting (not yet running) items for which `predicate(item)` is true (lock held)."""
        for ticket in [t for t in self._pending if predicate(t.item)]:
            self._pending.remove(ticket)
            ticket.error, ticket.done = error, True
        self._cond.notify_all()

    @contextmanager
    def idle(self) -> Iterator[None]:
        """Hold the lock while no batch runs (to change state a running batch reads)."""
        with self._cond:
            while self._running:
                self._cond.wait()
            yield

    def _wait_turn(self, ticket: _Ticket[T]) -> list[_Ticket[T]] | None:
        while not ticket.done:
            if not self._running and self._pending and self._ready():
                batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
                self._round_start = time.monotonic() if self._pending else None
                self._running = True
                self.batch_started([t.item for t in batch])
                return batch
            self._cond.wait(self._timeout())
        return None

    def _ready(self) -> bool:
        if len(self._pending) >= self.max_batch or self.all_arrived([t.item for t in self._pending]):
            return True
        return self._round_start is not None and time.monotonic() - self._round_start >= self.window_s

    def _timeout(self) -> float | None:
        if self._running or self._round_start is None:
            return None  # woken by the running batch or by the next arrival
        return max(0.0, self._round_start + self.window_s - time.monotonic())

    def _execute(self, batch: list[_Ticket[T]]) -> None:
        items = [t.item for t in batch]
        outcomes = self._run(items, retried=False)
        failed = any(error is not None for _, error in outcomes)
        with self._cond:
            try:
                self.batch_finished(items, None if failed else [result for result, _ in outcomes])
            finally:
                for ticket, (result, error) in zip(batch, outcomes, strict=True):
                    ticket.result, ticket.error, ticket.done = result, error, True
                self._running = False
                self.batches += 1
                self.rows += len(batch)
                self._cond.notify_all()

    def _run(self, items: list[T], *, retried: bool) -> list[tuple[Any, BaseException | None]]:
        """(result, error) per item. Out of memory: the cache is freed and the batch runs again, in
        halves when `split_on_oom`; items that still do not fit alone get `OutOfMemory`."""
        try:
            results = self.run_batch(items)
            if len(results) != len(items):
                raise RuntimeError(f"a batch of {len(items)} gave {len(results)} results")
            return [(result, None) for result in results]
        except BaseException as exc:  # every waiting thread must hear of it, whatever it is
            if not is_out_of_memory(exc):
                return [(None, exc)] * len(items)
            free_cached_memory()
            if self.split_on_oom and len(items) > 1:
                half = len(items) // 2
                return self._run(items[:half], retried=retried) + self._run(items[half:], retried=retried)
            if not retried:
                return self._run(items, retried=True)
            error = out_of_memory(f"a batched step of {len(items)} request(s)", exc)
            error.__cause__ = exc
            return [(None, error)] * len(items)


@dataclass(eq=False)
class BatchMember:
    """A request's place in a `DecodeBatcher`: its pool slot and how many positions it has filled."""

    slot: int
    length: int  # positions filled; the next step writes here
    capacity: int  # the request's own limit (its KV cache capacity)
    active: bool = True
    away: bool = False  # missed the last batch: not waited for until it steps again
    steps: int = 0  # decode steps run


class DecodeBatcher(Rendezvous[tuple[BatchMember, int], Tensor]):
    """Runs concurrent requests' decode steps as one batched forward (see the module docstring).

    Use from each request's thread: `member = batcher.join(cache)` after its prefill (None when all
    `max_batch` slots are taken: decode alone), then `batcher.step(member, token)` per token, then
    `batcher.leave(member)` (also on errors and cancellation).
    """

    def __init__(
        self,
        model: SpeechLM,
        *,
        max_batch: int = 8,
        window_s: float = DEFAULT_DECODE_WINDOW_S,
        capacity_step: int = 256,
    ) -> None:
        super().__init__(max_batch=max_batch, window_s=window_s)
        if capacity_step < 1:
            raise ValueError(f"capacity_step must be at least 1, got {capacity_step}")
        self.model = model
        self.capacity_step = capacity_step
        self._members: list[BatchMember] = []  # index == slot
        self._pool: KVCache | None = None  # (layers, 2, max_batch, kv_heads, capacity, head_dim)

    @property
    def active(self) -> int:
        """Requests currently in the batch."""
        with self._cond:
            return len(self._members)

    @property
    def pool_capacity(self) -> int:
        return 0 if self._pool is None else self._pool.capacity

    def join(self, cache: KVCache) -> BatchMember | None:
        """Enter the batch with a prefilled one-row `cache` (copied into a slot; the cache itself is
        no longer written). None when every slot is taken."""
        if cache.batch != 1:
            raise ValueError(f"join takes a one-row cache, got {cache.batch} rows")
        with self.idle():
            if len(self._members) >= self.max_batch:
                return None
            # One spare position: an absent member's placeholder row writes at its `length`.
            self._ensure_capacity(cache.capacity + 1)
            assert self._pool is not None
            member = BatchMember(slot=len(self._members), length=cache.length, capacity=cache.capacity)
            cache.copy_into(self._pool, member.slot)
            self._members.append(member)
            self._cond.notify_all()
            return member

    def leave(self, member: BatchMember) -> None:
        """Leave the batch (idempotent). From another thread, a step still waiting raises Cancelled."""
        with self._cond:
            if not member.active:
                return
            self.withdraw(lambda item: item[0] is member, Cancelled("the request left the decode batch"))
        with self.idle():
            if not member.active:
                return
            member.active = False
            last = self._members.pop()
            if last is not member:
                assert self._pool is not None
                buffer = self._pool.buffer
                buffer[:, :, member.slot, :, : last.length] = buffer[:, :, last.slot, :, : last.length]
                self._pool.clear_from(last.length, member.slot)  # the leaver's keys/values past it
                last.slot = member.slot
                self._members[member.slot] = last
            self._cond.notify_all()  # a round may now be complete

    def step(self, member: BatchMember, token: int) -> Tensor:
        """Feed `token` for `member`; its log-probs `(V,)` for the next token once the batch has run.

        Raises BatchError (in every member's thread) when the batched forward fails, OutOfMemory when
        it still does not fit after the cache was freed (the member stays usable: nothing advanced).
        """
        return self.submit((member, int(token)))

    # ---- Rendezvous hooks -----------------------------------------------------------------------
    def admit(self, item: tuple[BatchMember, int]) -> None:
        member = item[0]
        if not member.active:
            raise InputError("this request has left the decode batch; join again to continue")
        if member.length >= member.capacity:
            raise ValueError(f"KV cache full: {member.capacity} positions used")
        member.away = False

    def all_arrived(self, pending: list[tuple[BatchMember, int]]) -> bool:
        arrived = {id(m) for m, _ in pending}
        return all(id(m) in arrived for m in self._members if not m.away)

    def batch_started(self, items: list[tuple[BatchMember, int]]) -> None:
        inside = {id(m) for m, _ in items}
        for member in self._members:
            if id(member) not in inside:
                member.away = True

    def run_batch(self, items: list[tuple[BatchMember, int]]) -> list[Tensor]:
        # Members cannot join or leave while a batch runs (`idle`), so the slots are stable here.
        assert self._pool is not None
        members = self._members
        tokens = [0] * len(members)
        for member, token in items:
            tokens[member.slot] = token
        positions = [m.length for m in members]
        device = self._pool.buffer.device
        with torch.inference_mode():
            logp = self.model.decode_rows(
                to_device(torch.tensor(tokens, dtype=torch.long), device),
                self._pool.buffer[:, :, : len(members)],
                to_device(torch.tensor(positions, dtype=torch.long), device),
                max(positions) + 1,
            )
            return [logp[member.slot].clone() for member, _ in items]

    def batch_finished(self, items: list[tuple[BatchMember, int]], results: Sequence[Tensor] | None) -> None:
        if results is not None:
            for member, _ in items:
                member.length += 1
                member.steps += 1

    # ---- internals ------------------------------------------------------------------------------
    def _ensure_capacity(self, needed: int) -> None:
        """Grow the pool (lock held, no batch running) to at least `needed` positions."""
        if self._pool is not None and self._pool.capacity >= needed:
            return
        capacity = -(-needed // self.capacity_step) * self.capacity_step
        weight = self.model.speech_embedding.weight
        pool = KVCache.allocate(
            self.model.config.qwen2, capacity, batch=self.max_batch, device=weight.device, dtype=weight.dtype
        )
        if self._pool is not None:
            old = self._pool.buffer
            pool.buffer[:, :, :, :, : old.shape[4]] = old
        self._pool = pool
