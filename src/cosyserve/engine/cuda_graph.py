"""The LM decode step on static buffers, replayed as a CUDA graph on the GPU.

A decode step is a few hundred small kernels; on a GPU launching them costs more than running them.
`StaticDecodeStep` keeps every tensor of the step at a fixed address (a fixed-capacity KV cache, the
input token and position, the output log-probs), so the whole step can be captured once with
`torch.cuda.CUDAGraph` and replayed with one launch. The step attends over the whole capacity with a
mask (`SpeechLM.decode_rows`), so its shapes never change. On the CPU the same static-buffer step runs
eagerly: that is what the tests compare with the normal decode step.

A step serves one request at a time: the request prefills into `reset()`'s cache, then calls the step
once per token. `StaticDecodePool` holds one step per capacity bucket (powers of two), all captured
when the engine starts (`capture_plan`), so a handful of graphs serve every request length and no
request ever waits for a capture.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from cosyserve.engine.kv_cache import KVCache
from cosyserve.engine.memory import free_cached_memory, is_out_of_memory
from cosyserve.model.speech_lm import SpeechLM

log = logging.getLogger(__name__)

MIN_CAPACITY = 256  # smallest bucket: short requests share one graph
# The positions of the longest request the service makes: a 30 s prompt (750 speech tokens and ~200
# transcript tokens with the system prompt), an 80-token sentence and its 20 x 80 speech tokens at most.
# Its bucket (4096) and the smaller ones: 5 graphs, ~200 MB of static KV caches in float32 for the
# full-size LM. Longer requests decode the normal way.
DEFAULT_GRAPH_POSITIONS = 2 + 200 + 80 + 750 + 20 * 80
DEFAULT_MAX_STEPS = 8
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
        # Warm-up and capture write K/V at position 0 (the position buffer is 0): `reset` clears it.
        if self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; the model is on {self.device}")
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


def capture_plan(longest: int, limit: int, max_steps: int, minimum: int = MIN_CAPACITY) -> list[int]:
    """The buckets to capture at start: `minimum`, 2 x `minimum`, ... up to the bucket of `longest`
    positions (capped at `limit`); when that makes more than `max_steps`, the largest `max_steps`
    (a request fits any bucket at least its size, so the large ones matter most)."""
    if max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, got {max_steps}")
    top = capacity_bucket(max(1, longest), limit, minimum)
    buckets = []
    bucket = min(minimum, top)
    while bucket < top:
        buckets.append(bucket)
        bucket *= 2
    buckets.append(top)
    return buckets[-max_steps:]


class StaticDecodePool:
    """Static decode steps, one per capacity bucket, all built (on CUDA: captured) when the pool is
    made, i.e. at engine start after the model is loaded; lent to one request at a time.

    No step is ever built or captured while serving: capturing takes the GPU for seconds and would
    land on the first request of each length. A request gets the smallest free step that fits it, or
    None (it then decodes the normal way): every step busy, or a request longer than the largest.
    """

    def __init__(self, model: SpeechLM, capacities: Sequence[int], *, capture: bool | None = None) -> None:
        if not capacities:
            raise ValueError("a static decode pool needs at least one capacity")
        self.model = model
        self._lock = threading.Lock()
        started = time.perf_counter()
        steps = [StaticDecodeStep(model, capacity, capture=capture) for capacity in sorted(set(capacities))]
        self.build_s = time.perf_counter() - started
        self._free: dict[int, list[StaticDecodeStep]] = {step.capacity: [step] for step in steps}
        self.capacities = tuple(step.capacity for step in steps)
        self.captured = all(step.captured for step in steps)
        if self.captured:
            log.info(
                "captured %d CUDA graphs of the LM decode step (capacities %s) in %.2f s",
                len(steps),
                ", ".join(map(str, self.capacities)),
                self.build_s,
            )

    @classmethod
    def for_requests(
        cls,
        model: SpeechLM,
        longest: int = DEFAULT_GRAPH_POSITIONS,
        *,
        max_steps: int = DEFAULT_MAX_STEPS,
        capture: bool | None = None,
    ) -> StaticDecodePool:
        """A pool whose buckets cover requests of up to `longest` positions (`capture_plan`)."""
        plan = capture_plan(longest, model.qwen2.rotary.max_positions, max_steps)
        return cls(model, plan, capture=capture)

    @property
    def built(self) -> int:
        return len(self.capacities)

    def acquire(self, capacity: int) -> StaticDecodeStep | None:
        """The smallest free step with room for `capacity` positions, or None."""
        with self._lock:
            for bucket in self.capacities:
                free = self._free[bucket]
                if bucket >= capacity and free:
                    return free.pop()
        return None

    def release(self, step: StaticDecodeStep) -> None:
        """Give a step back once its request has finished (or failed)."""
        with self._lock:
            self._free[step.capacity].append(step)


def capture_at_start(
    model: SpeechLM, longest: int = DEFAULT_GRAPH_POSITIONS, *, max_steps: int = DEFAULT_MAX_STEPS
) -> StaticDecodePool | None:
    """The engine's graph pool, every bucket captured now (`StaticDecodePool.for_requests`); None when
    the GPU runs out of memory doing so: the engine then starts without graphs (eager decode steps,
    the same tokens, slower) instead of failing to start, and says so in the log."""
    try:
        return StaticDecodePool.for_requests(model, longest, max_steps=max_steps, capture=True)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        free_cached_memory()
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        log.warning(
            "the GPU ran out of memory capturing the LM decode step's CUDA graphs (%s): decoding runs "
            "without them (slower); free GPU memory or lower the concurrency and restart to use them",
            first_line[:200],
        )
        return None
