"""Wall-clock bookkeeping of one benchmarked utterance."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from cosyserve.model.flow import CausalFlow


class StageClock:
    """Wall time of the flow and of all token-to-audio work; the vocoder's share is the difference.

    The flow is timed by wrapping its `inference*` and `solve_span` methods and its decoder's `solve` on
    the instances (whatever Token2Wav calls, one-shot, streaming or batched); Token2Wav calls are timed by
    the runner. CUDA is synchronised so the times are the device's, not the launches'.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.flow_seconds = 0.0
        self.token2wav_seconds = 0.0
        self._flow_depth = 0  # only the outermost of nested flow calls is counted

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @contextmanager
    def timing_flow(self, flow: CausalFlow) -> Iterator[None]:
        # One-shot passes go through `inference*`, a stream's reusing chunk passes through `solve_span`,
        # and batched requests (`engine.flow_batching`) straight through the decoder's `solve`.
        names = [name for name in dir(type(flow)) if name.startswith("inference") or name == "solve_span"]
        wrapped = [(flow, name) for name in names] + [(flow.decoder, "solve")]
        for owner, name in wrapped:
            setattr(owner, name, self._timed(getattr(owner, name)))
        try:
            yield
        finally:
            for owner, name in wrapped:
                delattr(owner, name)

    def _timed(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._flow_depth += 1
            start = self.now() if self._flow_depth == 1 else 0.0
            try:
                return method(*args, **kwargs)
            finally:
                self._flow_depth -= 1
                if self._flow_depth == 0:
                    self.flow_seconds += self.now() - start

        return timed

    @contextmanager
    def timing_token2wav(self) -> Iterator[None]:
        start = self.now()
        try:
            yield
        finally:
            self.token2wav_seconds += self.now() - start


@dataclass
class UtteranceTiming:
    prefill_seconds: float = 0.0
    first_token_seconds: float = 0.0
    decode_seconds: float = 0.0
    total_seconds: float = 0.0
    cpu_seconds: float = 0.0  # CPU time of this process (all threads) during the utterance
    first_chunk_seconds: float | None = None
    audio_samples: int = 0
    chunks: int = 0
    prefix_positions: int = 0
    voice_prepare_seconds: float | None = None
    voice_cache_bytes: int | None = None  # streaming: the saved voice's flow prompt keys/values
    stream_prefix_peak_bytes: int | None = None  # streaming: most flow keys/values the stream held
