"""The LM decode step on static buffers, replayed as a CUDA graph on the GPU.

A decode step is a few hundred small kernels; on a GPU launching them costs more than running them.
`StaticDecodeStep` keeps every tensor of the step at a fixed address (a fixed-capacity KV cache, the
input token and position, the output log-probs), so the whole step can be captured once with
`torch.cuda.CUDAGraph` and replayed with one launch. The step attends over the whole capacity with a
mask (`SpeechLM.decode_rows`), so its shapes never change. On the CPU the same static-buffer step runs
eagerly: that is what the tests compare with the normal decode step.

A step serves one request at a time: the request prefills into `reset()`'s cache, then calls the step
once per token. `StaticDecodePool` hands out steps by capacity bucket (powers of two), so a handful of
captured graphs serve every request length.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from cosyserve.engine.kv_cache import KVCache
from cosyserve.model.speech_lm import SpeechLM

MIN_CAPACITY = 256  # smallest bucket: short requests share one graph
_WARMUP_RUNS = 2  # eager runs on a side stream before capture (lazy init, kernel selection)
_EMPTY_GRAPH = "graph is empty"  # torch's warning when a capture recorded no kernel


class StaticDecodeStep:
    """One request's decode steps through fixed buffers; captured as a CUDA graph when `capture`.

    `capture=None` captures on CUDA and runs eagerly elsewhere.
    """

    def __init__(self, model: SpeechLM, capacity: int, *, capture: bool | None = None) -> None:
        weight = model.speech_embedding.weight
        device = weight.device
        limit = model.qwen2.rotary.max_positions
        if not 0 < capacity <= limit:
            raise ValueError(f"static decode capacity {capacity} must lie in [1, {limit}]")
        self.model = model
        self.cache = KVCache.allocate(model.config.qwen2, capacity, device=device, dtype=weight.dtype)
        self._token = torch.zeros(1, dtype=torch.long, device=device)
        self._position = torch.zeros(1, dtype=torch.long, device=device)
        self._logp: Tensor | None = None
        self._graph: torch.cuda.CUDAGraph | None = None
        if capture is None:
            capture = device.type == "cuda"
        if capture:
            if device.type != "cuda":
                raise ValueError(f"CUDA graphs need a CUDA device; the model is on {device}")
            self._capture()

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    @property
    def captured(self) -> bool:
        return self._graph is not None

    def reset(self, prefix: KVCache | None = None) -> KVCache:
        """Start a request: the static cache, empty or holding a copy of `prefix`. Prefill into it.

        Everything past the prefix is zeroed: the masked step reads the whole capacity, and a NaN left
        by an earlier request would otherwise reach this one's output (`KVCache.clear_from`)."""
        self.cache.length = 0
        if prefix is not None:
            prefix.copy_into(self.cache)
        else:
            self.cache.clear_from(0)
        return self.cache

    def __call__(self, token: int) -> Tensor:
        """Feed `token` at the cache's next position; log-probs `(1, V)` for the token after it."""
        position = self.cache.reserve(1)
        self._token.fill_(token)
        self._position.fill_(position)
        if self._graph is None:
            return self._forward()
        self._graph.replay()
        # The graph's output is overwritten by the next replay; the caller owns (and may edit) a copy.
        return self._logp.clone()  # type: ignore[union-attr]

    @property
    def device(self) -> torch.device:
        return self.cache.buffer.device

    def _forward(self) -> Tensor:
        return self.model.decode_rows(self._token, self.cache.buffer, self._position, self.capacity)

    def _capture(self) -> None:
        # Warm-up and capture write K/V at position 0 (the position buffer is 0): a request's prefill
        # overwrites it.
        with torch.inference_mode():
            self._graph, self._logp = capture_graph(self._forward, self.device)


class CudaGraphError(RuntimeError):
    """A CUDA graph capture recorded nothing: replaying it would return stale outputs."""


def capture_graph(
    forward: Callable[[], Tensor], device: torch.device, warmup_runs: int = _WARMUP_RUNS
) -> tuple[torch.cuda.CUDAGraph, Tensor]:
    """Warm `forward` up and capture it as a graph on a side stream of `device`; (graph, its output).

    `torch.cuda.graph` captures on a stream of the *current* device unless given one: with the model
    on cuda:1 and the current device 0, the kernels would run eagerly and the graph stay empty (torch
    only warns). So everything runs inside `torch.cuda.device(device)` on a stream of that device, and
    an empty graph raises CudaGraphError. `capture_error_mode="thread_local"` lets other threads keep
    using the GPU meanwhile.
    """
    with torch.cuda.device(device):
        side = torch.cuda.Stream(device)
        current = torch.cuda.current_stream(device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(warmup_runs):
                forward()
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                output = forward()
    for warning in caught:
        if _EMPTY_GRAPH in str(warning.message).lower():
            raise CudaGraphError(
                f"the CUDA graph captured on {device} is empty ({warning.message}); turn the "
                "gpu_batching setting off (engine option cuda_graph=False) and report this"
            )
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return graph, output


def capacity_bucket(capacity: int, limit: int, minimum: int = MIN_CAPACITY) -> int:
    """The smallest power of two >= `capacity` (at least `minimum`), capped at `limit`."""
    bucket = max(minimum, 1 << max(0, capacity - 1).bit_length())
    return min(bucket, limit)


class StaticDecodePool:
    """Static decode steps by capacity bucket, lent to one request at a time.

    At most `max_steps` are ever built (each holds a KV cache of its capacity and, on CUDA, a graph's
    memory); when none is free `acquire` returns None and the request decodes the normal way.
    """

    def __init__(self, model: SpeechLM, *, capture: bool | None = None, max_steps: int = 8) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        self.model = model
        self.capture = capture
        self.max_steps = max_steps
        self._free: dict[int, list[StaticDecodeStep]] = {}
        self._built = 0
        self._lock = threading.Lock()
        self._capture_lock = threading.Lock()  # one capture at a time

    @property
    def built(self) -> int:
        return self._built

    def acquire(self, capacity: int) -> StaticDecodeStep | None:
        """A free step with room for `capacity` positions, built (and captured) if needed; or None."""
        bucket = capacity_bucket(capacity, self.model.qwen2.rotary.max_positions)
        if bucket < capacity:
            return None
        with self._lock:
            free = self._free.get(bucket)
            if free:
                return free.pop()
            if self._built >= self.max_steps:
                return None
            self._built += 1
        try:
            with self._capture_lock:
                return StaticDecodeStep(self.model, bucket, capture=self.capture)
        except BaseException:
            with self._lock:
                self._built -= 1
            raise

    def prebuild(self, capacities: Sequence[int]) -> None:
        """Build (and capture) one step per capacity now, e.g. at model load, instead of on the first
        request that needs it."""
        steps = [self.acquire(capacity) for capacity in capacities]
        for step in steps:
            if step is not None:
                self.release(step)

    def release(self, step: StaticDecodeStep) -> None:
        """Give a step back once its request has finished (or failed)."""
        with self._lock:
            self._free.setdefault(step.capacity, []).append(step)
