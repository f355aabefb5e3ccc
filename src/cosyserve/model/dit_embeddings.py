"""The DiT's input side: time embedding, input projection with causal position convolutions, and
rotary positions. Attribute names reproduce the official `decoder.estimator.*` checkpoint keys.

Shapes: B batch, T mel frames, C mel channels (80), D model width, H heads, Dh head width.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_TIME_FREQ_DIM = 256  # width of the sinusoidal timestep features
_TIME_SCALE = 1000.0  # t in [0, 1] is stretched before the sinusoids, as in training
_CONV_POS_KERNEL = 31
_CONV_POS_GROUPS = 16


def _timestep_features(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features of the flow time: (B,) -> (B, dim), sines first then cosines."""
    half = dim // 2
    rate = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, device=t.device).float() * -rate)
    angles = _TIME_SCALE * t.unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


class TimestepEmbedding(nn.Module):
    """Flow time (B,) -> conditioning vector (B, D)."""

    def __init__(self, dim: int, freq_dim: int = _TIME_FREQ_DIM) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.time_mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.time_mlp(_timestep_features(t, self.freq_dim).to(t.dtype))


class CausalConvPositionEmbedding(nn.Module):
    """Two grouped convolutions padded on the left only, so frame i never sees frames after i."""

    def __init__(self, dim: int, kernel_size: int = _CONV_POS_KERNEL, groups: int = _CONV_POS_GROUPS) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.conv1 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())

    @property
    def context_frames(self) -> int:
        """Earlier frames one output frame depends on (both convolutions together)."""
        return 2 * (self.kernel_size - 1)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, D) -> (B, T, D), a transposed view of the convolution's (B, D, T) output.

        Add it to a contiguous tensor as the second operand: a sum takes its layout from the first,
        and a transposed residual stream would make every later elementwise op and norm strided.

        context: (B, Tc, D) the inputs of the frames just before x, for a pass that continues an
        earlier one. With at least `context_frames` of them no padding is needed; fewer means they
        start at frame 0, and the zero padding goes before them, exactly as for the whole sequence.
        """
        if context is not None and context.shape[1] >= self.context_frames:
            h = torch.cat((context[:, -self.context_frames :], x), dim=1).transpose(1, 2)
            return self.conv2(self.conv1(h)).transpose(1, 2)
        frames = x.shape[1]
        if context is not None and context.shape[1]:
            x = torch.cat((context, x), dim=1)
        h = x.transpose(1, 2)
        h = self.conv1(F.pad(h, (self.kernel_size - 1, 0)))
        h = self.conv2(F.pad(h, (self.kernel_size - 1, 0)))
        return h.transpose(1, 2)[:, -frames:] if frames else h.transpose(1, 2)[:, :0]


class InputEmbedding(nn.Module):
    """Concatenate [x, cond, mu, spks] per frame, project to the model width, add conv positions."""

    def __init__(self, mel_dim: int, mu_dim: int, spk_dim: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(2 * mel_dim + mu_dim + spk_dim, dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(dim)

    def project(
        self, x: torch.Tensor, cond: torch.Tensor, mu: torch.Tensor, spks: torch.Tensor
    ) -> torch.Tensor:
        """x, cond: (B, T, C); mu: (B, T, mu_dim); spks: (B, spk_dim) -> (B, T, D), before positions."""
        spks = spks.unsqueeze(1).expand(-1, x.shape[1], -1)
        return self.proj(torch.cat((x, cond, mu, spks), dim=-1))

    def forward(
        self, x: torch.Tensor, cond: torch.Tensor, mu: torch.Tensor, spks: torch.Tensor
    ) -> torch.Tensor:
        """x, cond: (B, T, C); mu: (B, T, mu_dim); spks: (B, spk_dim) -> (B, T, D)."""
        h = self.project(x, cond, mu, spks)
        return h + self.conv_pos_embed(h)  # h first: the sum keeps its contiguous layout


class RotaryEmbedding(nn.Module):
    """Rotary position angles with adjacent channel pairs (x_transformers layout).

    `inv_freq` is a persistent buffer because the official checkpoint stores it.
    """

    def __init__(self, dim_head: int, base: float = 10000.0) -> None:
        super().__init__()
        if torch.empty(0).device.type == "meta":  # the checkpoint fills it; see qwen2.RotaryTable
            inv_freq = torch.empty((dim_head + 1) // 2)
        else:
            inv_freq = 1.0 / (base ** (torch.arange(0, dim_head, 2).float() / dim_head))
        self.register_buffer("inv_freq", inv_freq)

    def angles(self, seq_len: int, start: int = 0) -> torch.Tensor:
        """(T, Dh) angles in float32 of positions start .. start + T - 1, each frequency repeated for
        its channel pair."""
        inv_freq = self.inv_freq.float()
        positions = torch.arange(start, start + seq_len, device=inv_freq.device, dtype=torch.float32)
        angles = torch.outer(positions, inv_freq)
        return angles.repeat_interleave(2, dim=-1)


def apply_rotary(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate the first Dh channels of x (B, T, H*Dh) by angles (T, Dh), in place; returns x.

    The official model applies rotary before splitting heads, so only the first head's channels carry
    positions; the other heads pass through unchanged. The checkpoints were trained that way. Writing
    into x (a fresh projection) spares a copy of the untouched heads on every call.
    """
    head = x[..., : angles.shape[-1]]
    pairs = head.unflatten(-1, (-1, 2))
    rotated_half = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    head.mul_(angles.cos().to(x.dtype)).addcmul_(rotated_half, angles.sin().to(x.dtype))
    return x
