"""The frozen prefix of a streaming flow pass, kept so that later passes do not compute it again.

In streaming mode the DiT attends only within its 50-frame chunk and to earlier chunks, and the
position convolutions of its input embedding look only back. So a frame's whole trajectory through
the solver depends only on the inputs (start noise, prompt mel, speaker, token condition) of its own
chunk and the chunks before it. A frame's token condition is final once the `pre_lookahead_len` tokens
after its token are known; from then on every chunk whose frames all have final inputs has the same
keys and values, at every solver step and in every layer, in every later pass over a longer sequence.
A later pass then only computes the frames after them (`CausalFlow.inference_continued`).

A prefix is immutable: extending it returns a new one that shares the old segments, so one voice's
prompt prefix serves any number of requests at the same time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cosyserve.errors import InputError


@dataclass(frozen=True)
class KVSegment:
    """Keys and values of frames start .. end - 1 at every solver step and DiT layer.

    Kept as the pass produced them (no copy): keys[step][layer] is (2, H, T, Dh), the guidance halves
    (conditioned, unconditioned) first.
    """

    start: int
    end: int
    keys: tuple[tuple[torch.Tensor, ...], ...]
    values: tuple[tuple[torch.Tensor, ...], ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for per_step in (*self.keys, *self.values) for t in per_step)


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
    embed_context: torch.Tensor | None = None  # (S, 2, Tc, D), Tc <= the DiT's context_frames
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
        """Per layer, the key and value segments (2, H, Ti, Dh) of solver step `step`."""
        return [
            ([s.keys[step][layer] for s in self.segments], [s.values[step][layer] for s in self.segments])
            for layer in range(layers)
        ]

    def context(self, step: int) -> torch.Tensor | None:
        """(2, Tc, D) projected inputs of the last frames at solver step `step`, or None when empty."""
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
        end: int,
        keys: Sequence[Sequence[torch.Tensor]],
        values: Sequence[Sequence[torch.Tensor]],
        projected: Sequence[torch.Tensor],
        tokens: torch.Tensor,
        tokens_needed: int,
        context_frames: int,
    ) -> FlowPrefix:
        """A new prefix with frames start .. end - 1 of a pass that began at `start` (= self.frames).

        keys, values: [step][layer] (2, H, T, Dh) of that pass's frames; projected: [step] (2, T, D);
        tokens: the pass's tokens, of which the first `tokens_needed` determine frames before `end`.
        """
        if start != self.frames:
            raise ValueError(f"a pass from frame {start} cannot extend a prefix of {self.frames} frames")
        count = end - start
        kept_k, kept_v = _first_frames(keys, count), _first_frames(values, count)
        new_context = torch.stack([p[:, :count] for p in projected])
        if self.embed_context is not None:
            new_context = torch.cat((self.embed_context, new_context), dim=2)
        return FlowPrefix(
            tokens=tokens[:, :tokens_needed].detach().cpu().clone(),
            n_timesteps=self.n_timesteps,
            segments=(*self.segments, KVSegment(start, end, kept_k, kept_v)),
            embed_context=new_context[:, :, -context_frames:].clone(),
            guidance=self.guidance,
        )


def _first_frames(
    per_step: Sequence[Sequence[torch.Tensor]], count: int
) -> tuple[tuple[torch.Tensor, ...], ...]:
    """The first `count` frames of [step][layer] (2, H, T, Dh): the tensors themselves when that is all
    of them, else copies (a view would keep the whole pass's frames alive)."""
    if count == per_step[0][0].shape[2]:
        return tuple(tuple(layers) for layers in per_step)
    return tuple(tuple(kv[:, :, :count].clone() for kv in layers) for layers in per_step)
