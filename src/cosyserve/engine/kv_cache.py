"""Per-request key/value cache for the speech LM: one preallocated buffer and a length pointer.

The buffer is `(layers, 2, B, kv_heads, capacity, head_dim)` (index 0 = keys, 1 = values), allocated
once for the longest sequence a request can reach, so decoding never grows or reallocates it.
A cache filled with a saved voice's prompt prefix can be cloned into a fresh, larger cache and
continued: the prefix is computed once and reused by every request for that voice.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cosyserve.model.config import Qwen2Config


class KVCache:
    """Keys/values of the first `length` positions, stored in a fixed-capacity buffer."""

    def __init__(self, buffer: Tensor, length: int = 0) -> None:
        if buffer.dim() != 6 or buffer.shape[1] != 2:
            raise ValueError(
                f"KV buffer must be (layers, 2, B, kv_heads, capacity, head_dim), got {tuple(buffer.shape)}"
            )
        if not 0 <= length <= buffer.shape[4]:
            raise ValueError(f"length {length} outside the buffer capacity {buffer.shape[4]}")
        self.buffer = buffer
        self.length = length

    @classmethod
    def allocate(
        cls,
        config: Qwen2Config,
        capacity: int,
        *,
        batch: int = 1,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> KVCache:
        """An empty cache for `capacity` positions of the Qwen2 stack described by `config`."""
        shape = (config.num_hidden_layers, 2, batch, config.num_key_value_heads, capacity, config.head_dim)
        # Zeros rather than empty: positions past `length` are never read, but zeros keep dumps readable.
        return cls(torch.zeros(shape, device=device, dtype=dtype))

    @property
    def capacity(self) -> int:
        return self.buffer.shape[4]

    @property
    def batch(self) -> int:
        return self.buffer.shape[2]

    @property
    def remaining(self) -> int:
        """Positions that can still be written."""
        return self.capacity - self.length

    def reserve(self, count: int) -> int:
        """Claim `count` positions; return where they start. The caller then writes them via the model."""
        if count > self.remaining:
            raise ValueError(
                f"KV cache full: {count} more positions requested, {self.remaining} of {self.capacity} left"
            )
        start = self.length
        self.length += count
        return start

    def clone(self, capacity: int | None = None) -> KVCache:
        """A new cache holding a copy of the first `length` positions, with room for `capacity` in all.

        Used to continue from a cached prompt prefix without modifying the saved prefix.
        """
        capacity = self.capacity if capacity is None else capacity
        if capacity < self.length:
            raise ValueError(f"clone capacity {capacity} is smaller than the cached length {self.length}")
        shape = (*self.buffer.shape[:4], capacity, self.buffer.shape[5])
        buffer = torch.zeros(shape, device=self.buffer.device, dtype=self.buffer.dtype)
        buffer[:, :, :, :, : self.length] = self.buffer[:, :, :, :, : self.length]
        return KVCache(buffer, self.length)

    def copy_into(self, dest: KVCache, row: int = 0) -> KVCache:
        """Write this one-row cache's filled positions into batch row `row` of `dest` (same layout, any
        device); `dest.length` is set to `length`, its buffer and capacity are kept. Returns `dest`.

        The rest of the row is zeroed (`clear_from`): a reused buffer (a static decode step, a batch
        pool slot) still holds the previous request's keys/values there."""
        if self.batch != 1:
            raise ValueError(f"only a one-row cache can be copied into a row, this one has {self.batch}")
        if dest.capacity < self.length:
            raise ValueError(f"destination capacity {dest.capacity} is smaller than the length {self.length}")
        dest.buffer[:, :, row, :, : self.length] = self.buffer[:, :, 0, :, : self.length]
        dest.clear_from(self.length, row)
        dest.length = self.length
        return dest

    def clear_from(self, position: int, row: int | None = None) -> None:
        """Zero positions `[position, capacity)` of batch row `row` (every row when None).

        A masked decode step (`SpeechLM.decode_rows`) reads the whole buffer: masking hides stale keys
        from the scores, but their weight 0 times a stale value that is NaN or inf is NaN, so positions
        a request has not written must hold finite values. Zeroing them when a buffer changes hands
        costs one fill per request instead of a masked copy of the values in every step.
        """
        rows = slice(None) if row is None else row
        self.buffer[:, :, rows, :, position:].zero_()

    def compact(self) -> KVCache:
        """A copy trimmed to exactly `length` positions: the form in which to store a reusable prefix."""
        return self.clone(self.length)

    def to(self, device: torch.device | str) -> KVCache:
        """This cache on `device` (a stored prefix may live on CPU and be used on the GPU)."""
        return KVCache(self.buffer.to(device), self.length)

    def nbytes(self) -> int:
        """Memory held by the buffer, for cache budgeting."""
        return self.buffer.numel() * self.buffer.element_size()
