"""Per-stream flow state: the frozen prefix of a streaming flow pass, kept so that later passes do not
compute it again, within a byte budget; and a stream's progress through the official schedule.

In streaming mode the DiT attends only within its 50-frame chunk and to earlier chunks, and the
position convolutions of its input embedding look only back. So a frame's whole trajectory through
the solver depends only on the inputs (start noise, prompt mel, speaker, token condition) of its own
chunk and the chunks before it. A frame's token condition is final once the `pre_lookahead_len` tokens
after its token are known; from then on every chunk whose frames all have final inputs has the same
keys and values, at every solver step and in every layer, in every later pass over a longer sequence.
A later pass then only computes the frames after them (`continue_flow`, on `CausalFlow.solve_span`).

Every later chunk attends to every earlier frame (the official chunk mask has no left limit), so
nothing can be dropped while more chunks may come; the final call is a full-attention pass that reuses
none of it, so a stream frees its prefix before that call.

A prefix is immutable: extending it returns a new one that shares the old segments, so one voice's
prompt prefix serves any number of requests at the same time. Each segment is one block of memory
(one allocation, written in place during the pass that computes it): many small kept tensors
interleaved with a pass's temporaries would fragment the heap, which holds on to the gaps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cosyserve.engine.vocoder_stream import VocoderStream
from cosyserve.errors import InputError
from cosyserve.model.flow import DEFAULT_N_TIMESTEPS, CausalFlow


@dataclass(frozen=True)
class FlowPrompt:
    """Everything the acoustic model takes from a prompt recording (computed once per voice)."""

    speech_token: torch.Tensor  # (1, Tp) int64 prompt speech tokens (25 Hz)
    speech_feat: torch.Tensor  # (1, 2 * Tp, 80) prompt mel (50 Hz)
    embedding: torch.Tensor  # (1, 192) speaker embedding

    @property
    def num_tokens(self) -> int:
        return int(self.speech_token.shape[1])


@dataclass(frozen=True)
class KVSegment:
    """Keys and values of frames start .. end - 1 at every solver step and DiT layer.

    kv: (S, L, 2, R, H, T, Dh), one block: kv[step, layer, 0] are the keys and kv[step, layer, 1] the
    values (R, H, T, Dh) of that step and layer; R rows are the guidance halves (conditioned,
    unconditioned), or 1 without guidance.
    """

    start: int
    end: int
    kv: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes


@dataclass(frozen=True)
class FlowPrefix:
    """Frames 0 .. frames - 1 (counted from the first prompt frame) of a streaming flow pass.

    `tokens` are the prompt + generated tokens these frames were computed from (every token their
    conditions read), on the host; a later pass must start with the same tokens. `embed_context`
    holds, per solver step, the projected inputs of the last frames, which the position convolutions
    of the next frames read.
    """

    tokens: torch.Tensor  # (1, n) int64, CPU
    n_timesteps: int
    segments: tuple[KVSegment, ...] = ()
    embed_context: torch.Tensor | None = None  # (S, R, Tc, D), Tc <= the DiT's context_frames
    guidance: bool = True  # False: one row (conditioned only) where the docs say 2

    @property
    def frames(self) -> int:
        return self.segments[-1].end if self.segments else 0

    @property
    def nbytes(self) -> int:
        """Memory held (segments shared with another prefix are counted in both)."""
        total = sum(s.nbytes for s in self.segments)
        return total + (0 if self.embed_context is None else self.embed_context.nbytes)

    @property
    def past_kv(self) -> list[torch.Tensor]:
        """The segments' blocks (S, L, 2, R, H, Ti, Dh) in order, as `CausalFlow.solve_span` takes them."""
        return [s.kv for s in self.segments]

    def check_continues(self, tokens: torch.Tensor, n_timesteps: int, guidance: bool = True) -> None:
        """Raise InputError unless a pass over `tokens` (1, n) on the host with `n_timesteps` steps (and
        guidance on or off) may reuse this."""
        if n_timesteps != self.n_timesteps:
            raise InputError(
                f"this stream's cached flow prefix was computed with {self.n_timesteps} solver steps, "
                f"not {n_timesteps}: use the same number of steps for every chunk of a stream"
            )
        if guidance != self.guidance:
            setting = "on" if self.guidance else "off"
            raise InputError(
                f"this stream's cached flow prefix was computed with guidance {setting}: use the same "
                "guidance setting for every chunk of a stream (and for its voice's prompt cache)"
            )
        have = self.tokens.shape[1]
        if tokens.shape[1] < have or not torch.equal(tokens[:, :have], self.tokens):
            raise InputError(
                "the tokens differ from those this stream's cached flow prefix was computed from: pass "
                "every token generated so far, unchanged, with the same prompt"
            )

    def extended(
        self,
        start: int,
        kv: torch.Tensor,
        context: torch.Tensor,
        tokens: torch.Tensor,
        context_frames: int,
    ) -> FlowPrefix:
        """A new prefix with the frames of a pass that began at `start` (= self.frames).

        kv: (S, L, 2, R, H, T, Dh) keys and values of exactly the frames to add (`KVSegment`, kept as
        given); context: (S, R, Tc, D) the projected inputs of the last Tc of them; tokens: (1, n) the
        host tokens that determine these frames.
        """
        if start != self.frames:
            raise ValueError(f"a pass from frame {start} cannot extend a prefix of {self.frames} frames")
        if self.embed_context is not None and context.shape[2] < context_frames:
            context = torch.cat((self.embed_context, context), dim=2)
        return FlowPrefix(
            tokens=tokens.clone(),
            n_timesteps=self.n_timesteps,
            segments=(*self.segments, KVSegment(start, start + kv.shape[5], kv)),
            embed_context=context[:, :, -context_frames:].clone(),
            guidance=self.guidance,
        )


def frames_within_budget(
    flow: CausalFlow, end: int, floor: int, budget: int | None, n_timesteps: int, guidance: bool
) -> int:
    """`end` lowered by whole chunks, not below `floor`, until a prefix of that many frames fits in
    `budget` bytes (`CausalFlow.prefix_nbytes`; None: no limit)."""
    chunk = flow.config.dit.static_chunk_size
    while end > floor and budget is not None and flow.prefix_nbytes(end, n_timesteps, guidance) > budget:
        end -= chunk
    return end


@torch.inference_mode()
def continue_flow(
    flow: CausalFlow,
    token: torch.Tensor,
    prompt_token: torch.Tensor,
    prompt_feat: torch.Tensor,
    embedding: torch.Tensor,
    prefix: FlowPrefix | None = None,
    *,
    finalize: bool = False,
    n_timesteps: int = DEFAULT_N_TIMESTEPS,
    stop_frame: int | None = None,
    max_prefix_bytes: int | None = None,
    guidance: bool = True,
) -> tuple[torch.Tensor, FlowPrefix]:
    """The streaming (chunked attention) mel, computing only the frames after `prefix`.

    Arguments as `CausalFlow.inference`; prefix: what an earlier call on the same prompt and a prefix
    of these tokens returned (None: nothing yet). Returns (mel, new prefix): mel (1, C, stop -
    prefix.frames) float32 of frames prefix.frames .. stop - 1 counted from the first PROMPT frame
    (unlike `inference`), stop = stop_frame or all N frames; these values are those of
    `inference(..., streaming=True, finalize=finalize)` up to rounding. The new prefix adds every whole
    chunk whose inputs no later token can change, as far as it then holds at most `max_prefix_bytes`.
    Raises InputError as `inference` does, or when the tokens do not continue those of the prefix.
    Token ids are read on the host: pass them there (a device copy would be read back each call).
    """
    inputs = flow.prepare_inputs(token, prompt_token, prompt_feat, embedding, finalize)
    host_tokens = torch.cat((prompt_token.cpu(), token.cpu()), dim=1).long()
    n_tokens, n_frames = host_tokens.shape[1], inputs.frames
    if prefix is None:
        prefix = FlowPrefix(host_tokens[:, :0], n_timesteps, guidance=guidance)
    prefix.check_continues(host_tokens, n_timesteps, guidance)
    start = prefix.frames
    stop = n_frames if stop_frame is None else min(stop_frame, n_frames)
    if stop <= start:
        if stop < start:
            raise InputError(f"stop_frame {stop} is before the {start} frames the prefix already holds")
        return inputs.noise[:, :, :0].float(), prefix
    # Decided before the pass, so that frames which will not be kept are never accumulated.
    keepable = max(start, flow.keepable_frames(n_tokens, stop))
    keep_end = frames_within_budget(flow, keepable, start, max_prefix_bytes, n_timesteps, guidance)
    mel, kv, context = flow.solve_span(
        inputs, start, stop, prefix.past_kv, prefix.embed_context,
        keep=keep_end - start, n_timesteps=n_timesteps, guidance=guidance,
    )  # fmt: skip
    if kv is not None and context is not None:
        needed = host_tokens[:, : flow.tokens_determining(keep_end)]
        prefix = prefix.extended(start, kv, context, needed, flow.context_frames)
    return mel, prefix


@dataclass
class StreamState:
    """Per-request streaming progress. Create with `Token2Wav.start_stream`; never shared."""

    prompt: FlowPrompt  # speech tokens on the host, features on the flow's device
    hop: int  # tokens the next chunk advances by (before the first-chunk padding)
    first_hop_padding: int  # tokens added to the first hop so prompt + hop is a multiple of chunk_size
    token_offset: int = 0  # tokens already turned into emitted audio
    mel: torch.Tensor | None = None  # (1, 80, frames) mel of every token before token_offset (no reuse)
    samples_emitted: int = 0
    finished: bool = False
    chunk_lengths: list[int] = field(default_factory=list)
    reuse: bool = False  # whether this stream reuses work (flow prefix, incremental vocoding)
    flow_prefix: FlowPrefix | None = None  # frozen flow work so far (reuse only)
    vocoder: VocoderStream | None = None  # incremental vocoding state (reuse only)

    @property
    def this_hop(self) -> int:
        return self.hop + (self.first_hop_padding if self.token_offset == 0 else 0)
