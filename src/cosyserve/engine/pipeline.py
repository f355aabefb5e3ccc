"""One text segment → audio: the speech LM feeding the acoustic runner, one-shot or streaming.

`SpeechEngine` holds the shared, read-only networks; everything a request changes lives in the
objects it creates per call (KV cache, sampler generator, stream state).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cosyserve.engine.decode_batching import DecodeBatcher
from cosyserve.engine.device import Placement
from cosyserve.engine.loading import load_flow, load_hift, load_speech_lm, network_dtypes, place_networks
from cosyserve.engine.memory import out_of_memory_as_error
from cosyserve.engine.quantize import apply_preset
from cosyserve.engine.speech_lm_runner import PromptPrefix, SpeechLMRunner
from cosyserve.engine.token2wav import FlowPrompt, PromptCache, Token2Wav
from cosyserve.errors import Cancelled
from cosyserve.model.flow import DEFAULT_N_TIMESTEPS, CausalFlow
from cosyserve.model.hift import HiFTVocoder
from cosyserve.model.interrupt import interruptible
from cosyserve.model.speech_lm import SpeechLM
from cosyserve.modeldir.model_dir import ModelDir

log = logging.getLogger(__name__)
CancelCheck = Callable[[], bool]


@dataclass
class SegmentStats:
    """What one segment cost; summed into the request's stage timings."""

    speech_tokens: int = 0
    speech_token_ids: list[int] = field(default_factory=list)  # what the LM said (the quality checks read it)
    llm_s: float = 0.0
    acoustic_s: float = 0.0  # flow + vocoder


@dataclass(frozen=True)
class SegmentInput:
    """The LM and acoustic inputs of one segment (ids from the tokenizer, prompt from the voice)."""

    text_ids: list[int]
    prompt_text_ids: list[int]  # [] in cross-lingual mode (the system sentence is in text_ids)
    lm_prompt_speech_ids: list[int]  # [] unless zero-shot clone
    flow_prompt: FlowPrompt
    lm_prefix: PromptPrefix | None = None  # a voice's prepared [sos, prompt_text] KV, if cached
    flow_cache: PromptCache | None = None  # a voice's prepared prompt K/V for streaming, if cached
    stats: SegmentStats = field(default_factory=SegmentStats)


@dataclass(frozen=True)
class EngineOptions:
    """How the networks run. The defaults are the exact, one-request-at-a-time path.

    batch_decode / batch_flow: concurrent requests share LM decode steps / one-shot flow passes
    (`engine.decode_batching`, `engine.flow_batching`; same outputs up to float rounding). They pay off on a
    GPU with more than one request at a time; on a CPU they only add waiting. cuda_graph: replay LM
    decode steps as CUDA graphs (CUDA only; requests in a decode batch do not use it).
    flow_steps < 10 and guidance=False are speed options that change the audio (see `cosyserve bench`).
    preset: a compute preset of `engine.quantize` ("exact", or "fast": int8 linears on the CPU).
    """

    batch_decode: bool = False
    max_batch: int = 8
    decode_window_s: float = 0.002
    batch_flow: bool = False
    max_flow_batch: int = 4
    cuda_graph: bool = False
    flow_steps: int = DEFAULT_N_TIMESTEPS
    guidance: bool = True
    preset: str = "exact"

    @classmethod
    def for_device(cls, device_type: str, concurrency: int) -> EngineOptions:
        """The recommended exact-path options: batching with concurrent requests on CUDA, CUDA graphs
        for a single request on CUDA, nothing extra on the CPU."""
        if device_type != "cuda":
            return cls()
        if concurrency > 1:
            return cls(batch_decode=True, max_batch=concurrency, batch_flow=True, max_flow_batch=concurrency)
        return cls(cuda_graph=True)


def build_runners(
    llm: SpeechLM,
    flow: CausalFlow,
    hift: HiFTVocoder,
    placement: Placement,
    options: EngineOptions,
    chunk_size: int,
    **token2wav_options: Any,
) -> tuple[SpeechLMRunner, Token2Wav]:
    """The LM runner and token-to-audio runner over placed networks, with `options`' batching, CUDA
    graphs and flow options: what the service runs, and what `cosyserve bench` measures."""
    flow.decoder.keep_time_conditioning()  # the weights are placed: the time modulation is fixed
    batcher = None
    if options.batch_decode:
        batcher = DecodeBatcher(llm, max_batch=options.max_batch, window_s=options.decode_window_s)
    lm = SpeechLMRunner(llm, batch_decode=batcher, use_cuda_graph=options.cuda_graph)
    token2wav = Token2Wav(
        flow,
        hift,
        placement,
        chunk_size=chunk_size,
        flow_steps=options.flow_steps,
        guidance=options.guidance,
        batch_flow=options.batch_flow,
        max_flow_batch=options.max_flow_batch,
        **token2wav_options,
    )
    return lm, token2wav


class SpeechEngine:
    """The loaded networks of one model directory on one device."""

    def __init__(
        self, model_dir: ModelDir, lm: SpeechLMRunner, token2wav: Token2Wav, placement: Placement
    ) -> None:
        self.model_dir = model_dir
        self.lm = lm
        self.token2wav = token2wav
        self.placement = placement
        self.sample_rate = model_dir.config.sample_rate
        self._prefix_lock = threading.Lock()

    @classmethod
    def load(
        cls, model_dir: ModelDir, placement: Placement, options: EngineOptions | None = None
    ) -> SpeechEngine:
        options = options or EngineOptions()
        model, flow, hift = place_networks(
            load_speech_lm(model_dir),
            load_flow(model_dir),
            load_hift(model_dir),
            placement,
            pack_lm=options.preset == "exact",  # a preset packs the LM's products itself
        )
        if options.preset != "exact":  # converts the networks in place, before the runners wrap them
            result = apply_preset(_Networks(model, flow), options.preset, measure=False, hift=hift)
            log.info("compute preset: %s", result.label)
        lm, token2wav = build_runners(model, flow, hift, placement, options, model_dir.config.chunk_size)
        return cls(model_dir, lm, token2wav, placement)

    def describe(self) -> dict[str, Any]:
        """How this engine runs, for readiness/model info: device, precision, the dtype of each part
        (`loading.network_dtypes`) and the GPU paths on (CUDA graphs, batching, flow options)."""
        t2w = self.token2wav
        return {
            "device": str(self.placement.device),
            "precision": self.placement.dtype_name,
            "dtypes": network_dtypes(self.lm.model, t2w.flow, t2w.hift, self.placement),
            "cuda_graph": self.lm.static_pool is not None,
            "batch_decode": self.lm.batcher is not None,
            "batch_flow": t2w.flow_batcher is not None,
            "flow_steps": t2w.flow_steps,
            "guidance": t2w.guidance,
        }

    def dtypes(self) -> dict[str, str]:
        """The dtype each part of the engine computes in (`describe()["dtypes"]`)."""
        return network_dtypes(self.lm.model, self.token2wav.flow, self.token2wav.hift, self.placement)

    def prepare_prefix(self, prompt_text_ids: list[int]) -> PromptPrefix:
        """The LM prefix `[sos, prompt_text]` of a voice, to be cached and reused by later requests."""
        with self._prefix_lock, out_of_memory_as_error("a voice's prompt preparation"):
            return self.lm.prepare_prefix(prompt_text_ids)

    def generate(
        self,
        segment: SegmentInput,
        *,
        generator: torch.Generator,
        stream: bool,
        speed: float = 1.0,
        cancel: CancelCheck = lambda: False,
    ) -> Iterator[np.ndarray]:
        """Yield float32 audio (S,) for one segment: several chunks when streaming, else one.

        Raises OutOfMemory (the device cache freed, the engine usable) when the GPU runs out of memory.
        """
        with out_of_memory_as_error("synthesis"):
            yield from self._generate(segment, generator, stream, speed, cancel)

    def _generate(
        self,
        segment: SegmentInput,
        generator: torch.Generator,
        stream: bool,
        speed: float,
        cancel: CancelCheck,
    ) -> Iterator[np.ndarray]:
        stats = segment.stats
        tokens = self.lm.generate(
            segment.text_ids,
            () if segment.lm_prefix is not None else segment.prompt_text_ids,
            segment.lm_prompt_speech_ids,
            prefix=segment.lm_prefix,
            generator=generator,
            cancel=cancel,
        )
        generated: list[int] = []
        state = self.token2wav.start_stream(segment.flow_prompt, segment.flow_cache) if stream else None
        llm_clock = time.perf_counter()
        for token in tokens:
            generated.append(token)
            if state is None or len(generated) < self.token2wav.tokens_needed(state):
                continue
            stats.llm_s += time.perf_counter() - llm_clock
            acoustic_clock = time.perf_counter()
            with interruptible(cancel):
                chunks = self.token2wav.stream_step(state, _host_tokens(generated))
            stats.acoustic_s += time.perf_counter() - acoustic_clock
            for chunk in chunks:
                yield chunk.cpu().numpy()
            llm_clock = time.perf_counter()
        stats.llm_s += time.perf_counter() - llm_clock
        stats.speech_tokens = len(generated)
        stats.speech_token_ids = generated
        if cancel():
            raise Cancelled("the request was cancelled")
        if not generated:
            return  # the LM ended at once (possible with random weights): nothing to say
        acoustic_clock = time.perf_counter()
        all_tokens = _host_tokens(generated)
        with interruptible(cancel):  # the flow's solver and the vocoder stop between their steps
            if state is None:
                audio = self.token2wav.synthesize(all_tokens, segment.flow_prompt, speed=speed)
            else:
                audio = self.token2wav.stream_finish(state, all_tokens)
        stats.acoustic_s += time.perf_counter() - acoustic_clock
        yield audio.cpu().numpy()


@dataclass(frozen=True)
class _Networks:
    """The two networks a compute preset converts (`quantize.HasLLMAndFlow`)."""

    llm: SpeechLM
    flow: CausalFlow


def _host_tokens(tokens: list[int]) -> torch.Tensor:
    """(1, T) int64 on the host: Token2Wav reads ids there and copies them to the device itself."""
    return torch.tensor(tokens, dtype=torch.long)[None]
