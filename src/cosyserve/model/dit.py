"""The flow-matching estimator: a diffusion transformer (DiT) that predicts the velocity field.

Inputs are the noisy mel `x`, the token condition `mu`, the prompt mel `cond` and the speaker vector
`spks`, all for the same mel frames; the flow timestep `t` modulates every block through adaptive
layer norms. Attribute names reproduce the official `decoder.estimator.*` checkpoint keys.

Shapes: B batch, T mel frames, C mel channels (80), D model width, H heads, Dh head width.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from cosyserve.errors import ConfigError
from cosyserve.model.config import DiTConfig
from cosyserve.model.dit_embeddings import InputEmbedding, RotaryEmbedding, TimestepEmbedding, apply_rotary

_NORM_EPS = 1e-6


def kv_dtype(param: torch.Tensor) -> torch.dtype:
    """The dtype keys and values come out in from a layer with this parameter: the autocast dtype when
    autocast is on for its device, else the parameter's own."""
    device_type = param.device.type
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return param.dtype


def modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """layer_norm(x) * (1 + scale) + shift: x (B, T, D); scale, shift (B or 1, D).

    With one row of modulation (every batch row at the same flow time, the usual case) the norm's
    affine step applies it in the same kernel; otherwise it is one fused multiply-add.
    """
    if scale.shape[0] == 1:
        return F.layer_norm(x, x.shape[-1:], 1 + scale[0], shift[0], eps=_NORM_EPS)
    normed = F.layer_norm(x, x.shape[-1:], eps=_NORM_EPS)
    return torch.addcmul(shift[:, None], normed, 1 + scale[:, None])


def gated_residual(x: torch.Tensor, gate: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """x + gate * update: x, update (B, T, D); gate (B or 1, D)."""
    return torch.addcmul(x, gate[:, None], update)


class AdaLayerNormZero(nn.Module):
    """Timestep-modulated layer norm of a block: returns the modulated x and the other five vectors.

    The six vectors come from the timestep embedding alone (`linear(silu(emb))`, see
    `DiT.time_conditioning`), so they are computed once per pass for all solver steps.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 6 * dim)

    def forward(self, x: torch.Tensor, mods: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x: (B, T, D), mods: (B or 1, 6D) -> x' (B, T, D); gate_msa, shift_mlp, scale_mlp, gate_mlp,
        each (B or 1, D)."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mods.chunk(6, dim=1)
        return modulate(x, scale_msa, shift_msa), gate_msa, shift_mlp, scale_mlp, gate_mlp


class AdaLayerNormZeroFinal(nn.Module):
    """Timestep-modulated layer norm before the output projection (scale first, then shift)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 2 * dim)

    def forward(self, x: torch.Tensor, mods: torch.Tensor) -> torch.Tensor:
        """x: (B, T, D), mods: (B or 1, 2D) = linear(silu(timestep embedding)) -> (B, T, D)."""
        scale, shift = mods.chunk(2, dim=1)
        return modulate(x, scale, shift)


class Attention(nn.Module):
    """Multi-head self-attention with rotary positions and a boolean attention mask."""

    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        self.heads, self.dim_head = heads, dim_head
        inner = heads * dim_head
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])  # a list so the key is `to_out.0`
        # The dtype the projections take and the scores and their weighted sum are computed in;
        # None: the input's. The fast preset sets bfloat16 where the CPU multiplies it natively, with
        # projections that take it (`engine.bfloat16_dit`).
        self.attention_dtype: torch.dtype | None = None
        # An engine's kernel for the scores and weighted sum, q, k, v -> (B, T, D) or None where it does
        # not take them (then SDPA); the fast preset sets one on CPUs where it is measured faster
        # (`engine.native_dit_attention`). Unmasked attention only.
        self.kernel: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor | None] | None = None

    def project(self, x: torch.Tensor, angles: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x: (B, T, D), angles: (T, Dh) -> q, k, v, each (B, H, T, Dh), positions applied."""
        batch = x.shape[0]
        if self.attention_dtype is not None:  # once for the three projections, which take it
            x = x.to(self.attention_dtype)
        q = apply_rotary(self.to_q(x), angles)
        k = apply_rotary(self.to_k(x), angles)
        v = self.to_v(x)
        dtype = self.attention_dtype or q.dtype
        return tuple(
            t.view(batch, -1, self.heads, self.dim_head).transpose(1, 2).to(dtype) for t in (q, k, v)
        )

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """q: (B, H, Tq, Dh); k, v: (B, H, Tk, Dh); attn_mask: (B or 1, 1, Tq, Tk) bool, or None for all
        keys -> (B, Tq, D)."""
        if attn_mask is None and self.kernel is not None:
            fused = self.kernel(q, k, v)
            if fused is not None:
                return self.to_out[0](fused)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        out = out.transpose(1, 2).reshape(q.shape[0], -1, self.heads * self.dim_head)
        return self.to_out[0](out)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None,
        frame_mask: torch.Tensor | None,
        angles: torch.Tensor,
    ) -> torch.Tensor:
        """x: (B, T, D); attn_mask: (B, 1, T, T) bool; frame_mask: (B, T, 1) bool; angles: (T, Dh).

        Both masks may be None when every frame is valid and attention is unrestricted."""
        q, k, v = self.project(x, angles)
        out = self.attend(q, k, v, attn_mask)
        return out if frame_mask is None else out.masked_fill(~frame_mask, 0.0)


class FeedForward(nn.Module):
    """Linear -> GELU (tanh approximation) -> Linear."""

    def __init__(self, dim: int, mult: int) -> None:
        super().__init__()
        inner = dim * mult
        # Index 1 held dropout in training; an Identity keeps the second linear at key `ff.2`.
        self.ff = nn.Sequential(
            nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")),
            nn.Identity(),
            nn.Linear(inner, dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


class DiTBlock(nn.Module):
    """Pre-norm attention and feed-forward, each modulated and gated by the timestep embedding."""

    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: int) -> None:
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim)
        self.attn = Attention(dim, heads, dim_head)
        self.ff = FeedForward(dim, ff_mult)

    def forward(
        self,
        x: torch.Tensor,
        mods: torch.Tensor,
        attn_mask: torch.Tensor | None,
        frame_mask: torch.Tensor | None,
        angles: torch.Tensor,
    ) -> torch.Tensor:
        """x: (B, T, D), mods: (B or 1, 6D) this block's time modulation -> (B, T, D); masks as in
        `Attention.forward`."""
        normed, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.attn_norm(x, mods)
        x = gated_residual(x, gate_msa, self.attn(normed, attn_mask, frame_mask, angles))
        return self._feed_forward(x, shift_mlp, scale_mlp, gate_mlp)

    def forward_continued(
        self,
        x: torch.Tensor,
        mods: torch.Tensor,
        attn_mask: torch.Tensor,
        angles: torch.Tensor,
        past: tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The block for frames that continue an earlier pass (every frame valid).

        x: (B, T, D) new frames; past: key and value segments (B, H, Ti, Dh) of all earlier frames, in
        order; attn_mask: (T, Tpast + T) bool. Returns (B, T, D) and this call's keys and values
        (B, H, T, Dh), which later passes take as `past`.
        """
        normed, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.attn_norm(x, mods)
        q, k, v = self.attn.project(normed, angles)
        keys = torch.cat((*past[0], k), dim=2) if past[0] else k
        values = torch.cat((*past[1], v), dim=2) if past[1] else v
        x = gated_residual(x, gate_msa, self.attn.attend(q, keys, values, attn_mask))
        return self._feed_forward(x, shift_mlp, scale_mlp, gate_mlp), k, v

    def _feed_forward(
        self, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, gate: torch.Tensor
    ) -> torch.Tensor:
        return gated_residual(x, gate, self.ff(modulate(x, scale, shift)))


def attention_mask(frame_mask: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Which keys each query may attend to: (B, T) bool valid frames -> (B, 1, T, T) bool.

    chunk_size > 0 (streaming): frame i sees every valid frame up to the end of its own chunk, so a
    chunk's output does not change when later chunks arrive. chunk_size <= 0: every valid frame.
    """
    seq_len = frame_mask.shape[1]
    keys = frame_mask[:, None, :].expand(-1, seq_len, -1)
    if chunk_size > 0:
        pos = torch.arange(seq_len, device=frame_mask.device)
        chunk_end = (pos // chunk_size + 1) * chunk_size
        keys = keys & (pos[None, :] < chunk_end[:, None])[None]
    return keys.unsqueeze(1)


def continued_attention_mask(start: int, frames: int, chunk_size: int, device: torch.device) -> torch.Tensor:
    """`attention_mask` rows of frames start .. start + frames - 1 over keys 0 .. start + frames - 1,
    all frames valid, chunked attention: (frames, start + frames) bool."""
    queries = torch.arange(start, start + frames, device=device)
    chunk_end = (queries // chunk_size + 1) * chunk_size
    return torch.arange(start + frames, device=device)[None, :] < chunk_end[:, None]


def _shared_rows(t: torch.Tensor, time: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
    """`time` cut to its first row when every row has the same flow time (t (B,); each entry (B, *)):
    the modulation vectors depend on t alone, and one row broadcasts over the batch (`modulate`).

    Decided from the layout when possible (the solver passes one time expanded over the rows), and
    from the values only on the CPU: reading device values would make the host wait for the GPU.
    """
    if t.numel() == 1 or t.stride(0) == 0:
        return [mods[:1] for mods in time]
    if t.device.type == "cpu" and bool((t == t[0]).all()):
        return [mods[:1] for mods in time]
    return time


def frame_masks(
    mask: torch.Tensor | None, batch: int, frames: int, chunk_size: int, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The attention mask (B, 1, T, T) and the padding mask (B, T, 1) of `DiT.forward`, each None when
    not needed. mask: (B, 1, T) nonzero on valid frames, or None when every frame is valid.

    A mask given on the CPU is read, and dropped when it has no padding (SDPA then runs its unmasked
    kernel); on an accelerator reading it would make the host wait, so it is applied as given.
    """
    if mask is None:
        if chunk_size <= 0:
            return None, None
        return attention_mask(torch.ones(batch, frames, dtype=torch.bool, device=device), chunk_size), None
    frame_mask = mask[:, 0].bool()  # (B, T)
    if mask.device.type == "cpu" and bool(frame_mask.all()):
        return (None if chunk_size <= 0 else attention_mask(frame_mask, chunk_size)), None
    return attention_mask(frame_mask, chunk_size), frame_mask[..., None]


class DiT(nn.Module):
    """The velocity estimator v(x, t | mu, spks, cond)."""

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.config = config
        self.time_embed = TimestepEmbedding(config.dim)
        self.input_embed = InputEmbedding(config.mel_dim, config.mu_dim, config.spk_dim, config.dim)
        self.rotary_embed = RotaryEmbedding(config.dim_head)
        self.transformer_blocks = nn.ModuleList(
            DiTBlock(config.dim, config.heads, config.dim_head, config.ff_mult) for _ in range(config.depth)
        )
        self.norm_out = AdaLayerNormZeroFinal(config.dim)
        self.proj_out = nn.Linear(config.dim, config.mel_dim)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        mu: torch.Tensor,
        t: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        streaming: bool = False,
        time: Sequence[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Velocity (B, C, T).

        x, cond: (B, C, T); mask: (B, 1, T), nonzero on valid frames, or None when all are valid;
        mu: (B, mu_dim, T); t: (B,) flow time in [0, 1]; spks: (B, spk_dim). `streaming` restricts
        attention to chunks of `static_chunk_size` frames (see `attention_mask`). time:
        `time_conditioning(t)`, if the caller computed it already (one solver step's slice of it).
        """
        chunk_size = self.config.static_chunk_size if streaming else 0
        attn_mask, zero_mask = frame_masks(mask, x.shape[0], x.shape[2], chunk_size, x.device)
        time = _shared_rows(t, self.time_conditioning(t) if time is None else time)
        h = self.input_embed(x.transpose(1, 2), cond.transpose(1, 2), mu.transpose(1, 2), spks)
        angles = self.rotary_embed.angles(h.shape[1])
        for block, mods in zip(self.transformer_blocks, time[:-1], strict=True):
            h = block(h, mods, attn_mask, zero_mask, angles)
        return self.proj_out(self.norm_out(h, time[-1])).transpose(1, 2)

    def set_attention_dtype(self, dtype: torch.dtype | None) -> None:
        """Compute every block's attention (scores, weighted sum, kept keys and values) in `dtype`;
        None: in the dtype of the block's input."""
        for block in self.transformer_blocks:
            block.attn.attention_dtype = dtype

    def kv_dtype(self) -> torch.dtype:
        """The dtype keys and values come out in: the attention's, else autocast's or the weights'."""
        first = self.transformer_blocks[0].attn.attention_dtype if len(self.transformer_blocks) else None
        return first or kv_dtype(self.proj_out.weight)

    def time_conditioning_modules(self) -> tuple[tuple[int, type], ...]:
        """The modules `time_conditioning` runs, by identity: another value once one is replaced (a
        preset's). A weight changed in place does not change it."""
        roots = [self.time_embed, *(block.attn_norm for block in self.transformer_blocks), self.norm_out]
        return tuple((id(module), type(module)) for root in roots for module in root.modules())

    def time_conditioning(self, t: torch.Tensor) -> list[torch.Tensor]:
        """What the blocks take from the flow time alone: t (..., B) -> per block its six modulation
        vectors (..., B, 6D), then the output norm's two (..., B, 2D). Given every solver step's times
        at once (S, B), each layer's weights are read once per pass instead of once per step."""
        emb = F.silu(self.time_embed(t.reshape(-1))).unflatten(0, t.shape)
        return [block.attn_norm.linear(emb) for block in self.transformer_blocks] + [
            self.norm_out.linear(emb)
        ]

    def forward_continued(
        self,
        x: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        start: int,
        past: Sequence[tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]],
        embed_context: torch.Tensor | None,
        kv_out: torch.Tensor | None = None,
        time: Sequence[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The streaming forward for frames start .. start + T - 1 when frames 0 .. start - 1 (whole
        chunks) were computed before: the same values as `forward(..., streaming=True)` on all frames.

        x, cond: (B, C, T); mu: (B, mu_dim, T); t: (B,); spks: (B, spk_dim), for the new frames only.
        past[layer]: key and value segments (B, H, Ti, Dh) of the earlier frames; embed_context:
        (B, Tc, D) their projected inputs (`InputEmbedding.project`; the last `context_frames` suffice).
        kv_out: (L, 2, B, H, K, Dh), K <= T: receives each layer's keys and values of the first K new
        frames, which later passes take as `past`; time: as in `forward`. Returns the velocity (B, C, T)
        and the projected inputs (B, T, D) of the new frames.
        """
        chunk_size = self.config.static_chunk_size
        if chunk_size <= 0 or start % chunk_size:
            raise ConfigError(
                f"a continued DiT pass needs static_chunk_size > 0 and a start on a chunk boundary, got "
                f"{chunk_size} and {start}; check the flow section of the model's YAML"
            )
        time = _shared_rows(t, self.time_conditioning(t) if time is None else time)
        projected = self.input_embed.project(
            x.transpose(1, 2), cond.transpose(1, 2), mu.transpose(1, 2), spks
        )
        h = projected + self.input_embed.conv_pos_embed(projected, embed_context)
        angles = self.rotary_embed.angles(h.shape[1], start)
        attn_mask = continued_attention_mask(start, h.shape[1], chunk_size, h.device)
        keep = 0 if kv_out is None else kv_out.shape[4]
        for layer, (block, layer_past) in enumerate(zip(self.transformer_blocks, past, strict=True)):
            h, k, v = block.forward_continued(h, time[layer], attn_mask, angles, layer_past)
            if keep:
                kv_out[layer, 0].copy_(k[:, :, :keep])
                kv_out[layer, 1].copy_(v[:, :, :keep])
        return self.proj_out(self.norm_out(h, time[-1])).transpose(1, 2), projected
