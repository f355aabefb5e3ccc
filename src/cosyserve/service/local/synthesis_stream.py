"""One planned synthesis as it is read: its audio chunks in order, then `result()` with its scores.

Every take is scored when it ends (`service.quality`). A plan with more than one take, not streamed,
makes each take in full before giving any audio: a take that fails a check is made again with the next
seed (`quality.take_seed`), up to the plan's takes, and the kept one (`quality.best_take`) is what the
chunks and the result carry, with its own seed. A streamed request is scored, never made again (its audio
has already left).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from cosyserve.engine.memory import out_of_memory_as_error
from cosyserve.engine.pipeline import SegmentInput, SpeechEngine
from cosyserve.engine.speech_lm_runner import PromptPrefix
from cosyserve.engine.token2wav import FlowPrompt, PromptCache
from cosyserve.errors import Cancelled
from cosyserve.frontend.prompt_features import PromptFeatures
from cosyserve.frontend.text import PreparedText
from cosyserve.frontend.text.describe import reading_report
from cosyserve.frontend.tokenizer import TextTokenizer
from cosyserve.service.outcomes import AudioChunk, SentenceTiming, SynthesisProgress, SynthesisResult
from cosyserve.service.quality import QualityThresholds, TakeReport, TakeScores, best_take, take_seed
from cosyserve.service.quality.scorer import TakeInput, TakeScorer
from cosyserve.service.requests import MAX_SEED, SynthesisRequest
from cosyserve.service.stores.voices import Voice

ProgressCallback = Callable[[SynthesisProgress], None]


class Synthesizer(Protocol):
    """What a stream uses of its `synthesizer.Synthesizer` (which imports this module)."""

    engine: SpeechEngine
    tokenizer: TextTokenizer
    sample_rate: int
    scorer: TakeScorer | None

    def cached_prefix(self, prompt_text_ids: list[int]) -> PromptPrefix: ...

    def cached_flow_prompt(self, voice_id: str, prompt: FlowPrompt) -> PromptCache: ...


@dataclass(frozen=True)
class SynthesisPlan:
    """A checked request: everything needed to generate, computed before the first sample."""

    request: SynthesisRequest
    prepared: PreparedText
    features: PromptFeatures
    seed: int
    speed: float
    voice: Voice | None
    prompt_seconds: float
    takes: int = 1  # how many takes it may make (1: scored, never made again)
    thresholds: QualityThresholds = field(default_factory=QualityThresholds)
    voice_seconds_per_unit: float | None = None  # the voice's own pace, from its prompt and transcript


@dataclass
class _Take:
    """What one take made."""

    seed: int
    chunks: list[AudioChunk] = field(default_factory=list)
    timings: list[SentenceTiming] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)  # per segment
    scores: TakeScores | None = None

    @property
    def speech_tokens(self) -> int:
        return sum(len(ids) for ids in self.token_ids)


class SynthesisStream:
    """Audio chunks of one request, in order; `result()` after the last chunk. One consumer only."""

    def __init__(
        self,
        synthesizer: Synthesizer,
        plan: SynthesisPlan,
        progress: ProgressCallback | None,
        cancel: threading.Event | None,
    ) -> None:
        self._synth, self._plan = synthesizer, plan
        self._progress, self._cancel = progress, cancel or threading.Event()
        self.seed = plan.seed  # the kept take's once the takes are made
        self.warnings = list(plan.prepared.warnings)
        self._take = _Take(plan.seed)
        self._takes_made = 0
        self._choosing = False  # making one of several takes (`SynthesisProgress.kept`)
        self._stage = {"prompt": plan.prompt_seconds, "llm": 0.0, "acoustic": 0.0, "quality": 0.0}
        self._started_at: float | None = None
        # When the first audio left the engine (time.monotonic()): the one first-chunk measurement, read by
        # the stage timings here and by the service's first-chunk latency metric.
        self.first_audio_at: float | None = None
        self._iterator = self._run()

    def __iter__(self) -> Iterator[AudioChunk]:
        return self

    def __next__(self) -> AudioChunk:
        with out_of_memory_as_error("synthesis"):
            return next(self._iterator)

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def voice(self) -> Voice | None:
        """The saved voice it speaks with (None: an uploaded recording)."""
        return self._plan.voice

    @property
    def segment_count(self) -> int:
        """How many segments its text was split into (progress reports one after each)."""
        return len(self._plan.prepared.segments)

    @property
    def timings(self) -> list[SentenceTiming]:
        return self._take.timings

    def result(self) -> SynthesisResult:
        """The whole result; consumes whatever has not been read yet."""
        for _ in self:
            pass
        take = self._take
        with out_of_memory_as_error("synthesis"):
            pieces = [chunk.samples for chunk in take.chunks]
            audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        stages = dict(self._stage)
        if self.first_audio_at is not None and self._started_at is not None:
            stages["first_chunk"] = self.first_audio_at - self._started_at
        quality = TakeReport(take.scores, self._takes_made) if take.scores is not None else None
        return SynthesisResult(
            audio=audio,
            sample_rate=self._synth.sample_rate,
            seed=take.seed,
            timings=take.timings,
            speech_tokens=take.speech_tokens,
            stage_seconds=stages,
            warnings=self.warnings,
            reading=reading_report(self._plan.prepared, self._synth.tokenizer),
            quality=quality,
        )

    def _run(self) -> Iterator[AudioChunk]:
        plan = self._plan
        started = time.perf_counter()
        self._started_at = time.monotonic()
        if plan.takes <= 1 or plan.request.stream:
            yield from self._make_take(plan.seed)
        else:
            made: list[_Take] = []
            self._choosing = True  # progress of these takes is not the delivered audio's
            for index in range(plan.takes):
                for _ in self._make_take(take_seed(plan.seed, index, MAX_SEED)):
                    pass
                made.append(self._take)
                if self._take.scores is None or self._take.scores.passed:
                    break
            self._take = made[best_take([t.scores or TakeScores() for t in made])]
            self.seed = self._take.seed
            self._choosing = False
            yield from self._take.chunks
            if self._progress is not None:  # the kept take: what a job charges
                total = len(plan.prepared.segments)
                kept_s = sum(len(chunk.samples) for chunk in self._take.chunks) / self._synth.sample_rate
                self._progress(SynthesisProgress(total, total, kept_s, chosen=True))
        self._stage["total"] = time.perf_counter() - started + plan.prompt_seconds

    def _make_take(self, seed: int) -> Iterator[AudioChunk]:
        """Generate one take with `seed` into `self._take`, yielding its chunks, then score it."""
        plan, synth = self._plan, self._synth
        self._take = take = _Take(seed)
        self._takes_made += 1
        segments = plan.prepared.segments
        generator = torch.Generator().manual_seed(seed)
        flow_prompt = FlowPrompt(
            speech_token=plan.features.speech_token.long(),
            speech_feat=plan.features.speech_feat,
            embedding=plan.features.embedding,
        )
        lm_prompt_speech = (
            plan.features.speech_token[0].tolist() if plan.prepared.use_prompt_speech_tokens else []
        )
        prompt_text_ids = plan.prepared.lm_prompt_ids
        prefix = synth.cached_prefix(prompt_text_ids) if plan.voice is not None and prompt_text_ids else None
        stream_chunks = plan.request.stream and plan.speed == 1.0
        flow_cache = (
            synth.cached_flow_prompt(plan.voice.id, flow_prompt) if stream_chunks and plan.voice else None
        )
        samples_so_far = 0
        rate = synth.sample_rate
        self._report(0, len(segments), 0.0)
        for index, text_ids in enumerate(plan.prepared.segment_ids):
            if self._cancel.is_set():
                raise Cancelled("the request was cancelled")
            seg = SegmentInput(
                text_ids=text_ids,
                prompt_text_ids=prompt_text_ids,
                lm_prompt_speech_ids=lm_prompt_speech,
                flow_prompt=flow_prompt,
                lm_prefix=prefix,
                flow_cache=flow_cache,
            )
            segment_start = samples_so_far
            for audio in synth.engine.generate(
                seg, generator=generator, stream=stream_chunks, speed=plan.speed, cancel=self._cancel.is_set
            ):
                audio = _apply_volume(audio, plan.request.volume)
                if self.first_audio_at is None:
                    self.first_audio_at = time.monotonic()
                chunk = AudioChunk(samples=audio, sentence_index=index, sample_rate=rate)
                take.chunks.append(chunk)
                samples_so_far += len(audio)
                yield chunk
            self._stage["llm"] += seg.stats.llm_s
            self._stage["acoustic"] += seg.stats.acoustic_s
            take.token_ids.append(list(seg.stats.speech_token_ids))
            # The typed text of each segment is found once the first one is spoken (it is not needed sooner).
            shown = plan.prepared.written_segments[index]
            take.timings.append(SentenceTiming(index, shown, segment_start / rate, samples_so_far / rate))
            self._report(index + 1, len(segments), samples_so_far / rate)
        take.scores = self._score(take)

    def _score(self, take: _Take) -> TakeScores | None:
        scorer = self._synth.scorer
        if scorer is None:
            return None
        plan = self._plan
        pieces = [chunk.samples for chunk in take.chunks]
        scored = TakeInput(
            audio=np.concatenate(pieces) if pieces else np.zeros(0, np.float32),
            sample_rate=self._synth.sample_rate,
            text=plan.request.text,
            speech_tokens=take.token_ids,
            prompt_embedding=plan.features.embedding,
            voice_seconds_per_unit=plan.voice_seconds_per_unit,
            speed=plan.speed,
        )
        with out_of_memory_as_error("the take's quality check"):
            scores = scorer.score(scored, plan.thresholds)
        self._stage["quality"] += scores.scoring_s
        return scores

    def _report(self, done: int, total: int, seconds: float) -> None:
        if self._progress is not None:
            self._progress(SynthesisProgress(done, total, seconds, kept=not self._choosing))


def _apply_volume(audio: np.ndarray, volume: float) -> np.ndarray:
    audio = audio.astype(np.float32, copy=False)
    if volume != 1.0:
        audio = audio * np.float32(volume)
    return np.clip(audio, -1.0, 1.0)
