"""Speech tokens → 24 kHz audio: one-shot, and the official streaming schedule with per-request state.

Streaming follows the official CosyVoice3 schedule exactly (so its chunks equal the official chunks):
the first hop is padded so that prompt + hop is a multiple of `chunk_size` tokens, each chunk also
sees `pre_lookahead_len` look-ahead tokens, the hop doubles after every chunk up to `4 * chunk_size`,
the mel generated so far is kept and re-vocoded, and only samples not yet emitted are returned. Unlike
the official code, the hop lives in a per-request `StreamState`, never on the shared model.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from cosyserve.engine.device import Placement
from cosyserve.errors import InputError
from cosyserve.model.flow import MAX_MEL_FRAMES, CausalFlow
from cosyserve.model.hift import HiFTVocoder, SourceNoise

MIN_SPEED, MAX_SPEED = 0.5, 2.0


@dataclass(frozen=True)
class FlowPrompt:
    """Everything the acoustic model takes from a prompt recording (computed once per voice)."""

    speech_token: torch.Tensor  # (1, Tp) int64 prompt speech tokens (25 Hz)
    speech_feat: torch.Tensor  # (1, 2 * Tp, 80) prompt mel (50 Hz)
    embedding: torch.Tensor  # (1, 192) speaker embedding

    @property
    def num_tokens(self) -> int:
        return int(self.speech_token.shape[1])


@dataclass
class StreamState:
    """Per-request streaming progress. Create with `Token2Wav.start_stream`; never shared."""

    prompt: FlowPrompt
    hop: int  # tokens the next chunk advances by (before the first-chunk padding)
    first_hop_padding: int  # tokens added to the first hop so prompt + hop is a multiple of chunk_size
    token_offset: int = 0  # tokens already turned into emitted audio
    mel: torch.Tensor | None = None  # (1, 80, frames) mel of every token before token_offset
    samples_emitted: int = 0
    finished: bool = False
    chunk_lengths: list[int] = field(default_factory=list)

    @property
    def this_hop(self) -> int:
        return self.hop + (self.first_hop_padding if self.token_offset == 0 else 0)


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
    ) -> None:
        self.flow = flow
        self.hift = hift
        self.placement = placement or Placement(torch.device("cpu"))
        self.chunk_size = chunk_size
        self.max_hop = max_hop_factor * chunk_size
        self.hop_growth = hop_growth
        self.lookahead = flow.lookahead
        self.mel_ratio = flow.token_mel_ratio
        self.source_noise = source_noise  # None: the vocoder's fixed per-process noise

    # ---- one-shot -------------------------------------------------------------------------------
    def synthesize(self, tokens: torch.Tensor, prompt: FlowPrompt, speed: float = 1.0) -> torch.Tensor:
        """All speech tokens (1, T) → waveform (S,) float32 at 24 kHz. `speed` time-stretches the mel."""
        _check_speed(speed)
        mel = self._flow(tokens, prompt, streaming=False, finalize=True)
        if speed != 1.0:
            mel = F.interpolate(mel, size=int(mel.shape[2] / speed), mode="linear")
        wav, _ = self.hift.inference(mel, finalize=True, noise=self.source_noise)
        return wav[0]

    # ---- streaming ------------------------------------------------------------------------------
    def start_stream(self, prompt: FlowPrompt) -> StreamState:
        padding = math.ceil(prompt.num_tokens / self.chunk_size) * self.chunk_size - prompt.num_tokens
        return StreamState(prompt=prompt, hop=self.chunk_size, first_hop_padding=padding)

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
            mel = self._flow(chunk_tokens, state.prompt, streaming=True, finalize=False)
            chunks.append(self._emit(state, mel, finalize=False))
            state.token_offset += state.this_hop
            state.hop = min(self.max_hop, state.hop * self.hop_growth)
        return chunks

    def stream_finish(self, state: StreamState, tokens: torch.Tensor) -> torch.Tensor:
        """The last chunk: every token (1, T) after the emitted ones, finalized (full attention)."""
        if state.finished:
            raise InputError("this stream has already been finished")
        mel = self._flow(tokens, state.prompt, streaming=False, finalize=True)
        state.finished = True
        return self._emit(state, mel, finalize=True)

    def stream(self, tokens: torch.Tensor, prompt: FlowPrompt) -> list[torch.Tensor]:
        """Stream a complete token sequence as if it arrived one token at a time (tests, benchmarks)."""
        state = self.start_stream(prompt)
        chunks: list[torch.Tensor] = []
        for end in range(1, tokens.shape[1] + 1):
            if end >= self.tokens_needed(state):
                chunks += self.stream_step(state, tokens[:, :end])
        chunks.append(self.stream_finish(state, tokens))
        return chunks

    # ---- internals ------------------------------------------------------------------------------
    def _emit(self, state: StreamState, mel: torch.Tensor, finalize: bool) -> torch.Tensor:
        new_mel = mel[:, :, state.token_offset * self.mel_ratio :]
        state.mel = new_mel if state.mel is None else torch.cat((state.mel, new_mel), dim=2)
        wav, _ = self.hift.inference(state.mel, finalize=finalize, noise=self.source_noise)
        fresh = wav[0, state.samples_emitted :]
        state.samples_emitted += fresh.shape[0]
        state.chunk_lengths.append(int(fresh.shape[0]))
        return fresh

    def _flow(
        self, tokens: torch.Tensor, prompt: FlowPrompt, *, streaming: bool, finalize: bool
    ) -> torch.Tensor:
        frames = prompt.speech_feat.shape[1] + tokens.shape[1] * self.mel_ratio
        if frames > MAX_MEL_FRAMES:
            raise InputError(
                f"{tokens.shape[1]} speech tokens plus the prompt need {frames} mel frames, more than the "
                f"{MAX_MEL_FRAMES} (300 s) one generation allows: split the text into shorter pieces"
            )
        with self._autocast():
            return self.flow.inference(
                tokens,
                prompt.speech_token,
                prompt.speech_feat,
                prompt.embedding,
                streaming=streaming,
                finalize=finalize,
            ).float()

    def _autocast(self) -> AbstractContextManager[object]:
        if self.placement.autocast_enabled:
            return torch.autocast(device_type="cuda", dtype=self.placement.dtype)
        return nullcontext()


def _check_speed(speed: float) -> None:
    if not (MIN_SPEED <= speed <= MAX_SPEED) or math.isnan(speed):
        raise InputError(f"speed {speed} is out of range: use a value from {MIN_SPEED} to {MAX_SPEED}")
