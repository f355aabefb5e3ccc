"""The frozen prefix of a streaming flow pass, kept so that later passes do not compute it again.

In streaming mode the DiT attends only within its 50-frame chunk and to earlier chunks, and the
position convolutions of its input embedding look only back. So a frame's whole trajectory through
the solver depends only on the inputs (start noise, prompt mel, speaker, token condition) of its own
chunk and the chunks before it. A frame's token condition is final once the `pre_lookahead_len` tokens
after its token are known; from then on every chunk whose frames all have final inputs has the same
keys and values, at every solver step and in every layer, in every later pass over a longer sequence.
A later pass then only computes the frames after them (`CausalFlow.inference_continued`).

Every later chunk attends to every earlier frame (the official chunk mask has no left limit), so
nothing can be dropped while more chunks may come; the final call is a full-attention pass that reuses
none of it, so a stream frees its prefix before that call.

A prefix is immutable: extending it returns a new one that shares the old segments, so one voice's
prompt prefix serves any number of requests at the same time. Each segment is one block of memory
(one allocation, written in place during the pass that computes it): many small kept tensors
interleaved with a pass's temporaries would fragment the heap, which holds on to the gaps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cosyserve.errors import InputError
from cosyserve.model.config import DiTConfig


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
    conditions read); a later pass must start with the same tokens. `embed_context` holds, per solver
    step, the projected inputs of the last frames, which the position convolutions of the next frames
    read.
    """

    tokens: torch.Tensor  # (1, n) int64
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

    def past(self, step: int, layers: int) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
        """Per layer, the key and value segments (R, H, Ti, Dh) of solver step `step`."""
        return [
            ([s.kv[step, layer, 0] for s in self.segments], [s.kv[step, layer, 1] for s in self.segments])
            for layer in range(layers)
        ]

    def context(self, step: int) -> torch.Tensor | None:
        """(R, Tc, D) projected inputs of the last frames at solver step `step`, or None when empty."""
        return None if self.embed_context is None else self.embed_context[step]

    def check_continues(self, tokens: torch.Tensor, n_timesteps: int, guidance: bool = True) -> None:
        """Raise InputError unless a pass over `tokens` (1, n) with `n_timesteps` steps (and guidance
        on or off) may reuse this."""
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
        if tokens.shape[1] < have or not torch.equal(tokens[:, :have].cpu(), self.tokens):
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
        tokens_needed: int,
        context_frames: int,
    ) -> FlowPrefix:
        """A new prefix with the frames of a pass that began at `start` (= self.frames).

        kv: (S, L, 2, R, H, T, Dh) keys and values of exactly the frames to add (`KVSegment`, kept as
        given); context: (S, R, Tc, D) the projected inputs of the last Tc of them; tokens: the pass's
        tokens, of which the first `tokens_needed` determine these frames.
        """
        if start != self.frames:
            raise ValueError(f"a pass from frame {start} cannot extend a prefix of {self.frames} frames")
        if self.embed_context is not None and context.shape[2] < context_frames:
            context = torch.cat((self.embed_context, context), dim=2)
        return FlowPrefix(
            tokens=tokens[:, :tokens_needed].detach().cpu().clone(),
            n_timesteps=self.n_timesteps,
            segments=(*self.segments, KVSegment(start, start + kv.shape[5], kv)),
            embed_context=context[:, :, -context_frames:].clone(),
            guidance=self.guidance,
        )


def kv_dtype(param: torch.Tensor) -> torch.dtype:
    """The dtype keys and values come out in from a layer with this parameter: the autocast dtype when
    autocast is on for its device, else the parameter's own."""
    if torch.is_autocast_enabled(param.device.type):
        return torch.get_autocast_dtype(param.device.type)
    return param.dtype


def prefix_nbytes(
    dit: DiTConfig, frames: int, n_timesteps: int, guidance: bool, dtype: torch.dtype, context_frames: int
) -> int:
    """`FlowPrefix.nbytes` of `frames` frames: keys and values (2 x S x L x R x H x Dh a frame) and the
    projected inputs of the last `context_frames` of them (S x R x D a frame)."""
    item = torch.empty((), dtype=dtype).element_size()
    rows = 2 if guidance else 1
    per_frame = 2 * n_timesteps * dit.depth * rows * dit.heads * dit.dim_head * item
    return frames * per_frame + n_timesteps * rows * min(frames, context_frames) * dit.dim * item
