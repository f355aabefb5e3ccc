"""Per-voice streaming starts (`PromptCache`) and the byte-bounded store that keeps them for every
voice together (`PromptCacheStore`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from cosyserve.engine.flow_stream import FlowPrefix, FlowPrompt

DEFAULT_PROMPT_STORE_BYTES = 2 << 30  # all voices of a `PromptCacheStore` together


@dataclass(frozen=True)
class PromptCache:
    """What every stream of one voice starts from (`Token2Wav.prepare_prompt`): the flow's keys and
    values of the prompt frames that no generated token can change. Read-only, so one object serves
    any number of concurrent requests; it holds `nbytes` of memory (about 3.6 MB per cached prompt
    frame for the full-size flow in float32, half that in 16-bit), so cache it per saved voice
    (`PromptCacheStore`)."""

    prompt: FlowPrompt
    flow_prefix: FlowPrefix

    @property
    def frames(self) -> int:
        """Prompt mel frames whose flow work the cache holds (whole 50-frame chunks)."""
        return self.flow_prefix.frames

    @property
    def nbytes(self) -> int:
        return self.flow_prefix.nbytes


class PromptCacheStore:
    """Per-voice `PromptCache`s within a memory budget: the least recently used are dropped first.

    One store serves every thread. `get(key, prompt, prepare)` returns the cache of `key` when it was
    prepared for this prompt, else `prepare(prompt)` (outside the lock), kept while the caches fit in
    `max_bytes` together (None: no limit); one larger than that alone is returned but not kept.
    """

    def __init__(self, max_bytes: int | None = DEFAULT_PROMPT_STORE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._caches: OrderedDict[str, PromptCache] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, prompt: FlowPrompt, prepare: Callable[[FlowPrompt], PromptCache]) -> PromptCache:
        with self._lock:
            cache = self._caches.get(key)
            if cache is not None and (cache.prompt is prompt or same_prompt(cache.prompt, prompt)):
                self._caches.move_to_end(key)
                return cache
        cache = prepare(prompt)
        with self._lock:
            self._caches.pop(key, None)
            if self.max_bytes is None or cache.nbytes <= self.max_bytes:
                self._caches[key] = cache
                while self.max_bytes is not None and self._held() > self.max_bytes:
                    self._caches.popitem(last=False)
        return cache

    def discard(self, key: str) -> None:
        """Forget `key` (a voice deleted or changed); streams that hold its cache keep it until they end."""
        with self._lock:
            self._caches.pop(key, None)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._held()

    def _held(self) -> int:
        return sum(cache.nbytes for cache in self._caches.values())

    def __len__(self) -> int:
        return len(self._caches)

    def __contains__(self, key: object) -> bool:
        return key in self._caches


def same_prompt(a: FlowPrompt, b: FlowPrompt) -> bool:
    return all(
        x.shape == y.shape and torch.equal(x.cpu(), y.cpu())
        for x, y in (
            (a.speech_token, b.speech_token),
            (a.speech_feat, b.speech_feat),
            (a.embedding, b.embedding),
        )
    )
