"""Speech tokens → 24 kHz audio: one-shot, and the official streaming schedule with per-request state.

Streaming follows the official CosyVoice3 schedule exactly (so its chunks equal the official chunks):
the first hop is padded so that prompt + hop is a multiple of `chunk_size` tokens, each chunk also
sees `pre_lookahead_len` look-ahead tokens, the hop doubles after every chunk up to `4 * chunk_size`,
and only samples not yet emitted are returned; the last chunk is one full-attention pass over
everything, as in the official code. Unlike the official code, the hop lives in a per-request
`StreamState`, never on the shared model.

The official code recomputes the whole prefix at every chunk. With `reuse` (the default) the same
chunks come out of less work: the chunk-causal flow keeps the keys and values of finished chunks
(`FlowPrefix`, per request, and per voice for the prompt's fixed part: `prepare_prompt`), and the
vocoder runs on the new frames only (`vocode_increment`). Both give the official values up to float
rounding (about 1e-6). The per-stream state lives in `flow_stream` (prefixes, progress),
`vocoder_stream` and `prompt_cache` (per-voice starts and their store).

Memory: a kept frame costs `CausalFlow.prefix_nbytes` (3.6 MB full-size in float32). Every later chunk
attends to every earlier frame, so nothing is dropped while chunks may follow; the final pass reuses
nothing, so a stream frees its keys and values before it. Budgets: `max_prompt_cache_bytes` per
voice, `max_reuse_bytes` per stream (beyond it, later chunks recompute: slower, same audio), and
`PromptCacheStore` for all voices together.

Precision: on a GPU the flow runs under autocast (its DiT's weights cast to half once: `loading`),
the vocoder in float32 with TF32 off (`float32_exact`). Speech token ids stay on the host: they are
checked and compared there without waiting for the GPU, and copied over once per flow call.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F

from cosyserve.engine.device import Placement, float32_exact, to_device
from cosyserve.engine.flow_batching import FlowBatcher
from cosyserve.engine.flow_stream import (
    FlowPrefix,
    FlowPrompt,
    StreamState,
    continue_flow,
    frames_within_budget,
)
from cosyserve.engine.prompt_cache import (
    DEFAULT_PROMPT_STORE_BYTES,
    PromptCache,
    PromptCacheStore,
    same_prompt,
)
from cosyserve.engine.vocoder_stream import VocoderStream, vocode_increment
from cosyserve.errors import InputError
from cosyserve.limits import MAX_SPEED, MIN_SPEED
from cosyserve.model.flow import DEFAULT_N_TIMESTEPS, MAX_MEL_FRAMES, CausalFlow
from cosyserve.model.hift import HiFTVocoder, SourceNoise
from cosyserve.model.interrupt import checkpoint

__all__ = [
    "DEFAULT_MAX_PROMPT_CACHE_BYTES",
    "DEFAULT_MAX_REUSE_BYTES",
    "DEFAULT_PROMPT_STORE_BYTES",
    "MAX_SPEED",
    "MIN_SPEED",
    "FlowPrompt",
    "PromptCache",
    "PromptCacheStore",
    "StreamState",
    "Token2Wav",
]

# ~275 frames of the full-size flow in float32, the voice's prompt part included: a 6 s voice (0.9 GB)
# and a few frames of the stream's own. Streaming then peaks under 1.5x the float32 weights (issue 20:
# 1.47x measured; 1.2 GB peaked at 1.48-1.53x over three runs); every later chunk recomputes the frames
# past the budget (slower, same audio: +2 % on a 10 s sentence). With 4 GB (the earlier default) a 10 s
# sentence kept all its frames and peaked at 1.8x the weights.
DEFAULT_MAX_REUSE_BYTES = 1_000_000_000
DEFAULT_MAX_PROMPT_CACHE_BYTES = 2 << 30  # one voice: ~590 frames (a 12 s prompt), full-size, float32


class Token2Wav:
    """Runs flow + HiFT for one request at a time or many interleaved (all state is per request)."""

    def __init__(
        self,
        flow: CausalFlow,
        hift: HiFTVocoder,
        placement: Placement | None = None,
        *,
        chunk_size: int = 25,
        max_hop_factor: int = 4,
        hop_growth: int = 2,
        source_noise: SourceNoise | None = None,
        reuse: bool = True,
        max_reuse_bytes: int | None = DEFAULT_MAX_REUSE_BYTES,
        max_prompt_cache_bytes: int | None = DEFAULT_MAX_PROMPT_CACHE_BYTES,
        flow_steps: int = DEFAULT_N_TIMESTEPS,
        guidance: bool = True,
        batch_flow: bool = False,
        max_flow_batch: int = 4,
    ) -> None:
        """reuse: stream with the reusing flow and vocoder (same chunks, less work); False runs the
        official recomputing schedule. max_reuse_bytes: most flow prefix memory one stream keeps (its
        voice's shared prompt part included); past it the stream recomputes the frames after it at every
        later chunk (slower, same output). max_prompt_cache_bytes: most one `prepare_prompt` result
        holds; a longer prompt's cache covers its first chunks only, and each stream computes the rest.
        Sizes: `CausalFlow.prefix_nbytes` (3.6 MB a frame for the full-size flow in float32).
        flow_steps (fewer than the official 10) and guidance=False (no classifier-free guidance: half
        the DiT batch) are speed options that change the output; the defaults are the exact path.
        batch_flow: concurrent one-shot flow calls (`synthesize`, `stream_finish`) run as one padded
        batch of up to `max_flow_batch` requests (`flow_batching.FlowBatcher`; same mels to rounding)."""
        if not isinstance(flow_steps, int) or flow_steps < 1:
            raise InputError(f"flow_steps must be a whole number of at least 1, got {flow_steps!r}")
        self.flow = flow
        self.hift = hift
        self.placement = placement or Placement(torch.device("cpu"))
        self.chunk_size = chunk_size
        self.max_hop = max_hop_factor * chunk_size
        self.hop_growth = hop_growth
        self.lookahead = flow.lookahead
        self.mel_ratio = flow.token_mel_ratio
        self.source_noise = source_noise  # None: the vocoder's fixed per-process noise
        self.reuse = reuse
        self.max_reuse_bytes = max_reuse_bytes
        self.max_prompt_cache_bytes = max_prompt_cache_bytes
        self.flow_steps = flow_steps
        self.guidance = guidance
        self.flow_batcher = None
        if batch_flow:
            self.flow_batcher = FlowBatcher(
                flow,
                n_timesteps=flow_steps,
                guidance=guidance,
                max_batch=max_flow_batch,
                autocast=self._autocast,
            )

    @property
    def exact(self) -> bool:
        """Whether the flow runs the official solver (10 Euler steps with guidance)."""
        return self.flow_steps == DEFAULT_N_TIMESTEPS and self.guidance

    # ---- one-shot -------------------------------------------------------------------------------
    def synthesize(self, tokens: torch.Tensor, prompt: FlowPrompt, speed: float = 1.0) -> torch.Tensor:
        """All speech tokens (1, T) → waveform (S,) float32 at 24 kHz. `speed` time-stretches the mel."""
        _check_speed(speed)
        mel = self._flow(tokens, self._on_device(prompt), streaming=False, finalize=True)
        if speed != 1.0:
            mel = F.interpolate(mel, size=int(mel.shape[2] / speed), mode="linear")
        checkpoint()  # cancelled during the flow: not the vocoder's pass too
        with self._vocoder_precision():
            wav, _ = self.hift.inference(mel, finalize=True, noise=self.source_noise)
        return wav[0]

    # ---- streaming ------------------------------------------------------------------------------
    def prepare_prompt(self, prompt: FlowPrompt) -> PromptCache:
        """The per-voice start of every stream with this prompt (see `PromptCache`); pass it to
        `start_stream`. Costs about one flow pass over the prompt's fixed chunks (at most
        `max_prompt_cache_bytes` of them)."""
        chunk = max(self.flow.config.dit.static_chunk_size, 1)
        fixed = (prompt.num_tokens - self.lookahead) * self.mel_ratio  # later tokens cannot change these
        budget = self.max_prompt_cache_bytes
        placed = self._on_device(prompt)
        no_tokens = placed.speech_token[:, :0]
        with self._autocast():  # sizes in the dtype the pass computes in
            # Kept: whole chunks only, within the budget.
            frames = frames_within_budget(
                self.flow, fixed // chunk * chunk, 0, budget, self.flow_steps, self.guidance
            )
            if not (self._reusable(prompt) and frames > 0):
                empty = FlowPrefix(no_tokens.long(), self.flow_steps, guidance=self.guidance)
                return PromptCache(prompt, empty)
            # The pass runs to the end of the fixed frames when all their whole chunks are kept: the
            # shapes a stream without the cache uses, so that its first chunk matches this bit for bit
            # (matrix kernels may round differently for other lengths, and the vocoder's phase
            # amplifies any difference).
            _, prefix = continue_flow(
                self.flow, no_tokens, placed.speech_token, placed.speech_feat, placed.embedding,
                finalize=True, stop_frame=fixed if frames == fixed // chunk * chunk else frames,
                max_prefix_bytes=budget, n_timesteps=self.flow_steps, guidance=self.guidance,
            )  # fmt: skip
        return PromptCache(prompt, prefix)

    def start_stream(self, prompt: FlowPrompt, cache: PromptCache | None = None) -> StreamState:
        """A new stream. cache: the voice's `prepare_prompt` result, to skip the prompt's flow work."""
        padding = math.ceil(prompt.num_tokens / self.chunk_size) * self.chunk_size - prompt.num_tokens
        state = StreamState(prompt=prompt, hop=self.chunk_size, first_hop_padding=padding)
        state.reuse = self._reusable(prompt)
        if cache is not None:
            if cache.prompt is not prompt and not same_prompt(cache.prompt, prompt):
                raise InputError(
                    "the PromptCache was prepared for a different prompt: use the cache of this voice, "
                    "or none"
                )
            state.flow_prefix = cache.flow_prefix if state.reuse else None
        state.prompt = self._on_device(prompt)  # moved once per stream, not per chunk
        if state.reuse:
            state.vocoder = VocoderStream()
        return state

    def tokens_needed(self, state: StreamState) -> int:
        """How many generated tokens the next non-final chunk needs."""
        return state.token_offset + state.this_hop + self.lookahead

    def stream_step(self, state: StreamState, tokens: torch.Tensor) -> list[torch.Tensor]:
        """Given all tokens generated so far (1, T), emit every chunk that is ready (possibly none)."""
        if state.finished:
            raise InputError("this stream has already been finished")
        chunks = []
        while tokens.shape[1] >= self.tokens_needed(state):
            chunk_tokens = tokens[:, : self.tokens_needed(state)]
            if state.reuse:
                new_mel = self._flow_continued(state, chunk_tokens)
            else:
                mel = self._flow(chunk_tokens, state.prompt, streaming=True, finalize=False)
                new_mel = mel[:, :, state.token_offset * self.mel_ratio :]
            chunks.append(self._emit(state, new_mel, finalize=False))
            state.token_offset += state.this_hop
            state.hop = min(self.max_hop, state.hop * self.hop_growth)
        return chunks

    def stream_finish(self, state: StreamState, tokens: torch.Tensor) -> torch.Tensor:
        """The last chunk: every token (1, T) after the emitted ones, finalized (full attention)."""
        if state.finished:
            raise InputError("this stream has already been finished")
        # The final pass attends to everything (full attention, as the official): no cached keys or
        # values apply to it, so this request's are freed before it rather than held through it.
        state.flow_prefix = None
        mel = self._flow(tokens, state.prompt, streaming=False, finalize=True)
        state.finished = True
        return self._emit(state, mel[:, :, state.token_offset * self.mel_ratio :], finalize=True)

    def stream(
        self, tokens: torch.Tensor, prompt: FlowPrompt, cache: PromptCache | None = None
    ) -> list[torch.Tensor]:
        """Stream a complete token sequence as if it arrived one token at a time (tests, benchmarks)."""
        state = self.start_stream(prompt, cache)
        chunks: list[torch.Tensor] = []
        for end in range(1, tokens.shape[1] + 1):
            if end >= self.tokens_needed(state):
                chunks += self.stream_step(state, tokens[:, :end])
        chunks.append(self.stream_finish(state, tokens))
        return chunks

    # ---- internals ------------------------------------------------------------------------------
    def _emit(self, state: StreamState, new_mel: torch.Tensor, finalize: bool) -> torch.Tensor:
        """Vocode the mel of the tokens from token_offset on; return the samples not yet emitted."""
        with self._vocoder_precision():
            if state.vocoder is not None:
                fresh = vocode_increment(self.hift, state.vocoder, new_mel, finalize, self.source_noise)[0]
            else:
                state.mel = new_mel if state.mel is None else torch.cat((state.mel, new_mel), dim=2)
                wav, _ = self.hift.inference(state.mel, finalize=finalize, noise=self.source_noise)
                fresh = wav[0, state.samples_emitted :]
        state.samples_emitted += fresh.shape[0]
        state.chunk_lengths.append(int(fresh.shape[0]))
        return fresh

    def _flow_continued(self, state: StreamState, tokens: torch.Tensor) -> torch.Tensor:
        """Mel of the frames from token_offset on of a non-final chunk, reusing the stream's prefix."""
        self._check_frames(tokens, state.prompt)
        prompt = state.prompt
        with self._autocast():
            mel, prefix = continue_flow(
                self.flow, tokens, prompt.speech_token, prompt.speech_feat, prompt.embedding,
                state.flow_prefix, max_prefix_bytes=self.max_reuse_bytes, n_timesteps=self.flow_steps,
                guidance=self.guidance,
            )  # fmt: skip
        start = 0 if state.flow_prefix is None else state.flow_prefix.frames
        state.flow_prefix = prefix
        first = prompt.speech_feat.shape[1] + state.token_offset * self.mel_ratio
        return mel[:, :, first - start :].float()

    def _reusable(self, prompt: FlowPrompt) -> bool:
        # The reusing path emits frames counted from the prompt's mel, which must be 2 frames a token.
        return (
            self.reuse
            and self.flow.config.dit.static_chunk_size > 0
            and prompt.speech_feat.shape[1] == prompt.num_tokens * self.mel_ratio
        )

    def _check_frames(self, tokens: torch.Tensor, prompt: FlowPrompt) -> None:
        frames = prompt.speech_feat.shape[1] + tokens.shape[1] * self.mel_ratio
        if frames > MAX_MEL_FRAMES:
            raise InputError(
                f"{tokens.shape[1]} speech tokens plus the prompt need {frames} mel frames, more than the "
                f"{MAX_MEL_FRAMES} (300 s) one generation allows: split the text into shorter pieces"
            )

    def _flow(
        self, tokens: torch.Tensor, prompt: FlowPrompt, *, streaming: bool, finalize: bool
    ) -> torch.Tensor:
        self._check_frames(tokens, prompt)
        if self.flow_batcher is not None and not streaming and finalize:
            return self.flow_batcher.mel(tokens, prompt)
        with self._autocast():
            return self.flow.inference(
                tokens,
                prompt.speech_token,
                prompt.speech_feat,
                prompt.embedding,
                streaming=streaming,
                finalize=finalize,
                n_timesteps=self.flow_steps,
                guidance=self.guidance,
            ).float()

    def _on_device(self, prompt: FlowPrompt) -> FlowPrompt:
        """`prompt` with its features on the flow's device (pinned copies on CUDA) and its speech token
        ids on the host, checked there (itself when already so)."""
        device = self.flow.spk_embed_affine_layer.weight.device
        token = prompt.speech_token.cpu()  # ids are read on the host (checks, prefix comparisons)
        self.flow.check_ids(token, "prompt speech token")
        placed = FlowPrompt(token, to_device(prompt.speech_feat, device), to_device(prompt.embedding, device))
        if all(a is b for a, b in zip(_fields(placed), _fields(prompt), strict=True)):
            return prompt
        return placed

    def _autocast(self) -> AbstractContextManager[object]:
        if self.placement.autocast_enabled:
            return torch.autocast(device_type=self.placement.device.type, dtype=self.placement.dtype)
        return nullcontext()

    def _vocoder_precision(self) -> AbstractContextManager[object]:
        """The vocoder computes in float32: on a GPU without TF32 (`float32_exact`)."""
        return float32_exact() if self.placement.device.type == "cuda" else nullcontext()


def _fields(prompt: FlowPrompt) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return prompt.speech_token, prompt.speech_feat, prompt.embedding


def _check_speed(speed: float) -> None:
    if not (MIN_SPEED <= speed <= MAX_SPEED) or math.isnan(speed):
        raise InputError(f"speed {speed} is out of range: use a value from {MIN_SPEED} to {MAX_SPEED}")
