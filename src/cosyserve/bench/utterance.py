"""One benchmarked utterance (and several at once) through the engine's own runners.

The input is synthetic but shaped like a real request: a prompt of `prompt_seconds` (25 speech
tokens and 50 mel frames per second, random values), prompt text and text of one text token per
`SPEECH_TOKENS_PER_TEXT_TOKEN` speech tokens, and exactly `audio_seconds * 25` generated speech
tokens: stop ids are masked for the whole length (EOS ignored), so runs on different weights and
machines do the same work. Decoding goes through `SpeechLMRunner.session` (the CUDA-graph or batching
path when the engine options turn them on, as the service does), sampling through the request
sampler, and audio through `Token2Wav` (one-shot or its streaming schedule). Streaming runs as for a
saved voice: its flow prompt keys/values and its LM prefix `[sos, prompt text]` are prepared first and
timed apart (`voice_prepare_seconds`); decoding and chunk synthesis interleave in one thread, as a
request would.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from cosyserve.bench.timing import StageClock, UtteranceTiming
from cosyserve.engine.flow_stream import FlowPrompt
from cosyserve.engine.kv_cache import KVCache
from cosyserve.engine.sampling import SpeechTokenSampler
from cosyserve.engine.speech_lm_runner import ENDOFPROMPT_ID, SpeechLMRunner, decode_one, prefill
from cosyserve.engine.token2wav import Token2Wav
from cosyserve.model.config import CosyVoice3Config

SPEECH_TOKENS_PER_TEXT_TOKEN = 5  # typical of the 0.5B model: ~5 speech tokens (0.2 s) per BPE token
FIRST_SPECIAL_TEXT_ID = 151643  # text ids below this are ordinary BPE tokens


class Progress:
    """Receives stage messages and token counts; the default shows nothing."""

    def stage(self, message: str) -> None:
        pass

    def tokens(self, done: int, total: int) -> None:
        pass


@dataclass(frozen=True)
class BenchInputs:
    prompt_text: torch.Tensor  # (Tpt,) text ids ending in <|endofprompt|>
    text: torch.Tensor  # (Tt,)
    prompt: FlowPrompt  # speech tokens on the host, features on the device (as the engine keeps them)
    speech_tokens: int  # tokens to generate


def make_inputs(
    config: CosyVoice3Config, prompt_seconds: float, audio_seconds: float, seed: int, device: torch.device
) -> BenchInputs:
    generator = torch.Generator().manual_seed(seed)
    rate = config.token_frame_rate
    prompt_tokens = max(1, round(prompt_seconds * rate))
    speech_tokens = max(1, round(audio_seconds * rate))
    vocab = min(config.llm.qwen2.vocab_size, FIRST_SPECIAL_TEXT_ID)
    prompt_text = torch.randint(
        0, vocab, (math.ceil(prompt_tokens / SPEECH_TOKENS_PER_TEXT_TOKEN),), generator=generator
    )
    if config.llm.qwen2.vocab_size > ENDOFPROMPT_ID:
        prompt_text = torch.cat([prompt_text, torch.tensor([ENDOFPROMPT_ID])])
    text = torch.randint(
        0, vocab, (math.ceil(speech_tokens / SPEECH_TOKENS_PER_TEXT_TOKEN),), generator=generator
    )
    codes = config.llm.speech_token_size
    mel_shape = (1, prompt_tokens * config.token_mel_ratio, config.flow.output_size)
    prompt = FlowPrompt(
        speech_token=torch.randint(0, codes, (1, prompt_tokens), generator=generator),
        # A log-mel of speech lies roughly in [-11, 2]; values in that range cost the same as real ones.
        speech_feat=(torch.randn(mel_shape, generator=generator) * 2 - 5).to(device),
        embedding=torch.randn(1, config.flow.spk_embed_dim, generator=generator).to(device),
    )
    return BenchInputs(prompt_text, text, prompt, speech_tokens)


@torch.inference_mode()
def warm_up(runner: SpeechLMRunner, token2wav: Token2Wav, inputs: BenchInputs) -> None:
    """A few positions through each network: first-call allocations and kernel selection are not timed
    (the CUDA graphs of the LM decode step were captured when the runner was built, as at a server's
    start)."""
    llm = runner.model
    weight = llm.speech_embedding.weight
    embeds = llm.embed_prefix(inputs.prompt_text[:2], inputs.text[:2], inputs.prompt.speech_token[0, :2])
    cache = KVCache.allocate(llm.config.qwen2, embeds.shape[1] + 1, device=weight.device, dtype=weight.dtype)
    prefill(llm, embeds, cache)
    decode_one(llm, torch.tensor([0], device=weight.device), cache)
    short = FlowPrompt(
        inputs.prompt.speech_token[:, :2], inputs.prompt.speech_feat[:, :4], inputs.prompt.embedding
    )
    token2wav.synthesize(inputs.prompt.speech_token[:, :4], short)


@torch.inference_mode()
def run_utterance(
    runner: SpeechLMRunner,
    token2wav: Token2Wav,
    config: CosyVoice3Config,
    inputs: BenchInputs,
    stream: bool,
    clock: StageClock,
    progress: Progress,
    seed: int = 0,
) -> UtteranceTiming:
    total = inputs.speech_tokens
    sampler = SpeechTokenSampler(config.llm.sampling, config.llm.speech_token_size, min_len=total, seed=seed)
    timing = UtteranceTiming()
    voice_cache = lm_prefix = None
    if stream:
        # A saved voice has this per-voice work done once, before any request: not in the total (its
        # flow prompt keys/values and its LM prefix [sos, prompt text], as the service keeps them).
        prepare_start = clock.now()
        voice_cache = token2wav.prepare_prompt(inputs.prompt)
        lm_prefix = runner.prepare_prefix(inputs.prompt_text)
        timing.voice_prepare_seconds = clock.now() - prepare_start
        timing.voice_cache_bytes = timing.stream_prefix_peak_bytes = voice_cache.nbytes
        clock.flow_seconds = 0.0
    start = clock.now()
    cpu_start = time.process_time()
    if lm_prefix is None:
        embeds = runner.model.embed_prefix(inputs.prompt_text, inputs.text, inputs.prompt.speech_token[0])
        timing.prefix_positions = embeds.shape[1]
    else:
        embeds = runner.model.embed_request_suffix(inputs.text, inputs.prompt.speech_token[0])
        timing.prefix_positions = lm_prefix.cache.length + embeds.shape[1]
    state = token2wav.start_stream(inputs.prompt, voice_cache) if stream else None
    audio = _Audio(token2wav, inputs, state, timing, clock, start)
    tokens: list[int] = []
    with runner.session(timing.prefix_positions + total, lm_prefix) as session:
        logp = session.prefill(embeds)
        timing.prefill_seconds = clock.now() - start
        for step in range(total):
            step_start = clock.now()
            tokens.append(sampler.sample(logp[0]))
            if step + 1 < total:
                logp = session.step(tokens[-1])
            step_end = clock.now()
            if step == 0:
                timing.first_token_seconds = step_end - start
            timing.decode_seconds += step_end - step_start
            progress.tokens(step + 1, total)
            if state is not None and len(tokens) >= token2wav.tokens_needed(state):
                audio.stream(tokens)
    audio.finish(tokens)
    timing.total_seconds = clock.now() - start
    timing.cpu_seconds = time.process_time() - cpu_start
    return timing


@dataclass
class _Audio:
    """The token2wav half of one utterance: audio from the tokens so far, its time on `clock`, and what
    `timing` counts of it (chunks, samples, the first chunk's time from `start`)."""

    token2wav: Token2Wav
    inputs: BenchInputs
    state: Any  # the stream's state (None: not streamed, one synthesis at the end)
    timing: UtteranceTiming
    clock: StageClock
    start: float

    def stream(self, tokens: list[int]) -> None:
        """The chunks the tokens so far complete."""
        with self.clock.timing_token2wav():
            chunks = self.token2wav.stream_step(self.state, torch.tensor([tokens]))
        self._count(chunks)
        if self.state.flow_prefix is not None:
            peak = max(self.timing.stream_prefix_peak_bytes or 0, self.state.flow_prefix.nbytes)
            self.timing.stream_prefix_peak_bytes = peak

    def finish(self, tokens: list[int]) -> None:
        """The rest of the audio (all of it when not streamed)."""
        speech = torch.tensor([tokens])
        with self.clock.timing_token2wav():
            if self.state is None:
                wav = self.token2wav.synthesize(speech, self.inputs.prompt)
            else:
                wav = self.token2wav.stream_finish(self.state, speech)
        self._count([wav])  # streamed without an early chunk: the last is the first

    def _count(self, chunks: list[torch.Tensor]) -> None:
        timing = self.timing
        if self.state is not None and chunks and timing.first_chunk_seconds is None:
            timing.first_chunk_seconds = self.clock.now() - self.start
        timing.chunks += len(chunks)
        timing.audio_samples += sum(int(chunk.shape[0]) for chunk in chunks)


def run_concurrent(
    runner: SpeechLMRunner,
    token2wav: Token2Wav,
    config: CosyVoice3Config,
    inputs: BenchInputs,
    stream: bool,
    requests: int,
    seed: int,
) -> dict[str, Any]:
    """`requests` utterances at once, one thread each (as concurrent service requests), through the
    runners' batchers when the engine options have them: throughput and per-request latencies."""
    device = runner.model.speech_embedding.weight.device
    timings: list[UtteranceTiming | None] = [None] * requests
    errors: list[BaseException] = []
    barrier = threading.Barrier(requests)

    def request(index: int) -> UtteranceTiming:
        """Request `index`, on the calling thread, with its own seed (the same at once and in a row)."""
        clock = StageClock(device)
        return run_utterance(
            runner, token2wav, config, inputs, stream, clock, Progress(), seed=seed + 1 + index
        )

    def one(index: int) -> None:
        try:
            barrier.wait()
            timings[index] = request(index)
        except BaseException as exc:  # reported below, in the calling thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,), name=f"bench-{i}") for i in range(requests)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if errors:
        raise errors[0]
    done = [t for t in timings if t is not None]
    audio = sum(t.audio_samples for t in done) / config.sample_rate
    batcher = runner.batcher
    # The same requests one after another: what serving them one at a time costs.
    in_a_row = [request(index).total_seconds for index in range(requests)]
    alone = sum(in_a_row) / len(in_a_row)
    return {
        "requests": requests,
        "wall_seconds": wall,
        "audio_seconds": audio,
        "realtime_multiple": audio / wall,
        "request_seconds": [t.total_seconds for t in done],
        "in_a_row_seconds": sum(in_a_row),
        "in_a_row_request_seconds": in_a_row,
        "throughput_vs_in_a_row": sum(in_a_row) / wall,  # aggregate audio/s at once vs in a row
        "latency_vs_alone": max(t.total_seconds for t in done) / alone,  # slowest at once vs one alone
        "first_chunk_seconds": [t.first_chunk_seconds for t in done] if stream else None,
        "decode_batches": None if batcher is None else batcher.batches,
        "decode_rows_per_batch": None
        if batcher is None or not batcher.batches
        else batcher.rows / batcher.batches,
        "flow_batches": None if token2wav.flow_batcher is None else token2wav.flow_batcher.batches,
    }
