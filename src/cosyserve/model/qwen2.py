"""The Qwen2 decoder stack inside the CosyVoice3 LM, written for inference over an external KV cache.

Numerics follow Hugging Face `Qwen2Model` so the official checkpoints load by name and give the same
hidden states: RMSNorm in float32, rotary embeddings on the half-split layout (`rotate_half`),
grouped-query attention with biased q/k/v projections, SwiGLU feed-forward, final RMSNorm.

The cache is plain tensor storage owned by the caller (see `cosyserve.engine.kv_cache`): one buffer
of shape `(layers, 2, B, kv_heads, capacity, head_dim)`; a forward call writes the keys/values of its
`T` new positions at `start` and attends over `[0, start + T)`. Nothing here allocates per step
except activations, so a fixed-shape decode step can later be captured in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosyserve.model.config import Qwen2Config


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 and cast back (as HF Qwen2 does)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """`(..., dim)` → `(..., dim)`."""
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # One fused kernel computing the steps below in float32 (fewer ops per decode step).
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class RotaryTable(nn.Module):
    """cos and signed sin for every position up to `max_positions`, computed once (non-persistent buffers).

    `signed_sin` is sin with its first half negated, so rotating needs one swap of the two halves
    instead of HF's `rotate_half` (swap and negate); the products are the same.
    Built in float32 then cast with the module (`.to(dtype)`), matching HF's cast to the activation dtype.
    """

    def __init__(self, head_dim: int, theta: float, max_positions: int) -> None:
        super().__init__()
        self.head_dim, self.theta, self.max_positions = head_dim, theta, max_positions
        if torch.empty(0).device.type == "meta":  # shapes only (`rebuild` computes the values): computing
            # on meta would import torch._dynamo for its reference kernels, 1.3 s of a cold start
            cos = signed_sin = torch.empty(max_positions, head_dim)
        else:
            cos, signed_sin = self._compute(None)  # the default device
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("signed_sin", signed_sin, persistent=False)

    def _compute(self, device: torch.device | None) -> tuple[Tensor, Tensor]:
        exponents = (
            torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float() / self.head_dim
        )
        inv_freq = 1.0 / (self.theta**exponents)
        positions = torch.arange(self.max_positions, dtype=torch.float32, device=device)
        angles = torch.outer(positions, inv_freq)  # (P, head_dim / 2)
        cos, sin = angles.cos(), angles.sin()
        # HF's half-split layout: both halves use the same frequencies.
        return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)

    def rebuild(self, device: torch.device | str, dtype: torch.dtype = torch.float32) -> None:
        """Recompute the tables on `device` (needed after building the model on the meta device)."""
        cos, signed_sin = self._compute(torch.device(device))
        self.cos, self.signed_sin = cos.to(dtype), signed_sin.to(dtype)

    def forward(self, start: int, length: int) -> tuple[Tensor, Tensor]:
        """cos and signed sin for positions `[start, start + length)`, each `(length, head_dim)`."""
        return self.cos[start : start + length], self.signed_sin[start : start + length]


def _rotate(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """Rotary embedding of `(B, heads, T, head_dim)` with `(T, head_dim)` tables.

    Equal to HF's `x * cos + rotate_half(x) * sin`.
    """
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return x * cos + swapped * signed_sin


class Attention(nn.Module):
    """Grouped-query self-attention that reads and extends a caller-owned KV cache."""

    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        hidden, head_dim = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            head_dim,
        )
        self.q_proj = nn.Linear(hidden, self.num_heads * head_dim, bias=True)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * head_dim, bias=True)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * head_dim, bias=True)
        self.o_proj = nn.Linear(self.num_heads * head_dim, hidden, bias=False)
        # Optionally one module computing q, k and v together, `(..., hidden)` -> `(..., q + k + v)`
        # (see `fuse_qkv`); then the three projections above are gone.
        self.qkv_proj: nn.Module | None = None
        # A faster path for one new position (set by the engine, e.g. a compiled kernel): called as
        # `one_position(q, k, v, cos, signed_sin, kv, start)` with the projections `(B, 1, width)` before
        # rotation; it writes the rotated key and the value at `start` and returns the attention output
        # `(B, 1, heads * head_dim)`, or None to leave the step to the torch path below.
        self.one_position: Callable[..., Tensor | None] | None = None

    def fuse_qkv(self, make: Callable[[nn.Linear], nn.Module]) -> None:
        """Replace q_proj, k_proj and v_proj with `make(one Linear holding all three)`.

        One call per decode step instead of three; for the int8 preset this also quantises the shared
        input once. The weights are concatenated, so the fused module's outputs are the three
        projections side by side.
        """
        if self.qkv_proj is not None:
            raise ValueError("q, k and v are already fused in this layer")
        parts = (self.q_proj, self.k_proj, self.v_proj)
        fused = nn.Linear(parts[0].in_features, sum(p.out_features for p in parts), bias=True)
        fused = fused.to(device=parts[0].weight.device, dtype=parts[0].weight.dtype)
        with torch.no_grad():
            fused.weight.copy_(torch.cat([p.weight for p in parts]))
            fused.bias.copy_(torch.cat([p.bias for p in parts]))
        self.set_fused_qkv(make(fused.requires_grad_(False)))

    def set_fused_qkv(self, fused: nn.Module) -> None:
        """Replace q_proj, k_proj and v_proj with `fused`, which computes all three side by side:
        `(..., hidden)` → `(..., q + k + v)` (build it from their weights and biases first)."""
        if self.qkv_proj is not None:
            raise ValueError("q, k and v are already fused in this layer")
        self.qkv_proj = fused
        del self.q_proj, self.k_proj, self.v_proj

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`(B, T, hidden)` → q `(B, T, heads * head_dim)`, k and v `(B, T, kv_heads * head_dim)`."""
        if self.qkv_proj is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        kv_width = self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(x).split((self.num_heads * self.head_dim, kv_width, kv_width), dim=-1)
        return q, k, v

    def forward(
        self, x: Tensor, cos: Tensor, signed_sin: Tensor, kv: Tensor, start: int, mask: Tensor | None
    ) -> Tensor:
        """`x` `(B, T, hidden)`; `kv` this layer's cache `(2, B, kv_heads, capacity, head_dim)`.

        Writes positions `[start, start + T)` into `kv`, attends over `[0, start + T)`. `mask` is
        `None` when plain causal attention is right (T == 1, or start == 0), else `(T, start + T)` bool.
        """
        batch, length, _ = x.shape
        q, k, v = self._project(x)
        if length == 1 and self.one_position is not None:
            out = self.one_position(q, k, v, cos, signed_sin, kv, start)
            if out is not None:
                return self.o_proj(out)
        q = q.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, signed_sin), _rotate(k, cos, signed_sin)
        end = start + length
        kv[0, :, :, start:end] = k
        kv[1, :, :, start:end] = v
        keys, values = kv[0, :, :, :end], kv[1, :, :, :end]
        if length == 1 and q.device.type == "cpu":
            out = _attend_one_query(q, keys, values)
        else:
            # A fresh prefill is causal with aligned corners; after a cached prefix `mask` says it. One
            # query sees every key: SDPA's `is_causal` aligns a non-square mask top-left, which would
            # hide all but key 0 from it.
            causal = mask is None and length > 1
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, is_causal=causal, enable_gqa=True
            )
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim))

    def forward_rows(
        self, x: Tensor, cos: Tensor, signed_sin: Tensor, kv: Tensor, positions: Tensor, mask: Tensor
    ) -> Tensor:
        """One new position per row, each row at its own position: `x` `(B, 1, hidden)`.

        `cos`/`signed_sin` `(B, 1, 1, head_dim)`; `kv` `(2, B, kv_heads, capacity, head_dim)`;
        `positions` `(B,)` int64, where each row's key/value is written; `mask` `(B, 1, 1, K)` bool,
        the keys `[0, K)` each row may see. No Python value depends on the tensors (no host sync), so
        this can be captured in a CUDA graph.
        """
        batch = x.shape[0]
        q, k, v = self._project(x)
        q = q.view(batch, 1, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, 1, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, 1, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, signed_sin), _rotate(k, cos, signed_sin)
        index = positions.view(batch, 1, 1, 1).expand(batch, self.num_kv_heads, 1, self.head_dim)
        kv[0].scatter_(2, index, k)
        kv[1].scatter_(2, index, v)
        visible = mask.shape[-1]
        # Plain matmuls on every device: no kernel selection and nothing a CUDA graph cannot capture.
        out = _attend_one_query(q, keys=kv[0, :, :, :visible], values=kv[1, :, :, :visible], mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(batch, 1, self.num_heads * self.head_dim))


def _attend_one_query(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None) -> Tensor:
    """Attention of one new position over the whole cache, each query head group sharing its K/V head.

    `q` `(B, heads, 1, head_dim)`, `keys`/`values` `(B, kv_heads, L, head_dim)` → `(B, heads, 1, head_dim)`;
    `mask` `(B, 1, 1, L)` bool (True: visible), or None for all keys.
    Two batched matmuls and a softmax: for a single query this is cheaper on the CPU than the fused
    SDPA kernel, with the same result to float rounding. (GPUs keep SDPA: fused, and it accumulates
    half-precision inputs in float32.)
    """
    batch, heads, _, head_dim = q.shape
    kv_heads = keys.shape[1]
    grouped = q.reshape(batch, kv_heads, heads // kv_heads, head_dim) * head_dim**-0.5
    scores = torch.matmul(grouped, keys.transpose(-1, -2))  # (B, kv_heads, group, L)
    if mask is not None:
        scores = scores.masked_fill(~mask, -float("inf"))
    return torch.matmul(scores.softmax(dim=-1), values).reshape(batch, heads, 1, head_dim)


class FeedForward(nn.Module):
    """SwiGLU: `down(silu(gate(x)) * up(x))`."""

    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        # Optionally one module computing gate and up together, `(..., hidden)` -> `(..., 2 * inner)`
        # (see `fuse_gate_up`); then the two projections above are gone.
        self.gate_up_proj: nn.Module | None = None

    def fuse_gate_up(self, fused: nn.Module) -> None:
        """Replace gate_proj and up_proj with `fused`, which computes both: `(..., hidden)` →
        `(..., 2 * inner)`, gate then up (build it from their weights first). One product per step
        instead of two, with the same values: each output is the same dot product."""
        if self.gate_up_proj is not None:
            raise ValueError("gate and up are already fused in this layer")
        self.gate_up_proj = fused
        del self.gate_proj, self.up_proj

    def forward(self, x: Tensor) -> Tensor:
        """`(B, T, hidden)` → `(B, T, hidden)`."""
        if self.gate_up_proj is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm attention block then pre-norm feed-forward block, each with a residual."""

    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = FeedForward(config.hidden_size, config.intermediate_size)

    def forward(
        self, x: Tensor, cos: Tensor, signed_sin: Tensor, kv: Tensor, start: int, mask: Tensor | None
    ) -> Tensor:
        """`(B, T, hidden)` → `(B, T, hidden)`; see `Attention.forward` for the cache arguments."""
        x = x + self.self_attn(self.input_layernorm(x), cos, signed_sin, kv, start, mask)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_rows(
        self, x: Tensor, cos: Tensor, signed_sin: Tensor, kv: Tensor, positions: Tensor, mask: Tensor
    ) -> Tensor:
        """`(B, 1, hidden)` → `(B, 1, hidden)`, each row at its own position; see `Attention.forward_rows`."""
        x = x + self.self_attn.forward_rows(self.input_layernorm(x), cos, signed_sin, kv, positions, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen2Model(nn.Module):
    """`embed_tokens`, `layers`, `norm` (HF names); no `lm_head`, which speech decoding never uses."""

    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryTable(config.head_dim, config.rope_theta, config.max_position_embeddings)
        # A faster path for one new position per sequence through every layer (set by the engine, e.g. a
        # compiled step): called as `decode_step(embeds (B, 1, hidden), kv, positions)`, row b at
        # `positions[b]` (a list of ints); it writes each layer's keys and values there and returns the
        # last layer's output `(B, 1, hidden)` before the final norm, or None to leave the step to the
        # layers below.
        self.decode_step: Callable[..., Tensor | None] | None = None

    def forward(
        self, embeds: Tensor, kv: Tensor, start: int, *, hidden_states: list[Tensor] | None = None
    ) -> Tensor:
        """Run `embeds` `(B, T, hidden)` at positions `[start, start + T)`; return normed `(B, T, hidden)`.

        `kv` is the whole cache `(layers, 2, B, kv_heads, capacity, head_dim)`; the new positions are
        written into it. If `hidden_states` is a list, HF's `output_hidden_states` sequence is appended
        to it: the inputs, each layer's output but the last, then the normed output (layers + 1 entries).
        """
        length = embeds.shape[1]
        if start + length > self.rotary.max_positions:
            raise ValueError(
                f"positions up to {start + length} exceed the model's {self.rotary.max_positions}"
            )
        cos, signed_sin = self.rotary(start, length)
        cos, signed_sin = cos.to(embeds.dtype), signed_sin.to(embeds.dtype)
        if length == 1 and hidden_states is None and self.decode_step is not None:
            out = self.decode_step(embeds, kv, [start] * embeds.shape[0])
            if out is not None:
                return self.norm(out)
        mask = None
        if start > 0 and length > 1:
            # Continuing after a cached prefix: causal with the query block offset by `start`.
            rows = torch.arange(start, start + length, device=embeds.device)[:, None]
            mask = torch.arange(start + length, device=embeds.device)[None, :] <= rows
        x = embeds
        for index, layer in enumerate(self.layers):
            if hidden_states is not None:
                hidden_states.append(x)
            x = layer(x, cos, signed_sin, kv[index], start, mask)
        x = self.norm(x)
        if hidden_states is not None:
            hidden_states.append(x)
        return x

    def forward_rows(self, embeds: Tensor, kv: Tensor, positions: Tensor, keys: int) -> Tensor:
        """One decode step for `B` sequences that each sit at their own position; normed `(B, 1, hidden)`.

        `embeds` `(B, 1, hidden)`; `kv` `(layers, 2, B, kv_heads, capacity, head_dim)`, row b written at
        `positions[b]` (`(B,)` int64); row b attends to its keys `[0, positions[b]]`, all within the first
        `keys` positions (a Python int: the same every step for a fixed-shape CUDA graph).
        """
        if keys > self.rotary.max_positions or keys > kv.shape[4]:
            raise ValueError(
                f"{keys} visible keys exceed the model's {self.rotary.max_positions} positions or the "
                f"cache capacity {kv.shape[4]}"
            )
        if self.decode_step is not None and positions.device.type == "cpu":  # reading them: no device wait
            rows = positions.tolist()
            out = self.decode_step(embeds, kv, rows) if rows and max(rows) < keys else None
            if out is not None:
                return self.norm(out)
        cos = self.rotary.cos.index_select(0, positions)[:, None, None].to(embeds.dtype)
        signed_sin = self.rotary.signed_sin.index_select(0, positions)[:, None, None].to(embeds.dtype)
        mask = (torch.arange(keys, device=embeds.device)[None, :] <= positions[:, None])[:, None, None]
        x = embeds
        for index, layer in enumerate(self.layers):
            x = layer.forward_rows(x, cos, signed_sin, kv[index], positions, mask)
        return self.norm(x)
