"""The one place that decides where and in which precision the engine runs."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from cosyserve.errors import InputError

PRECISIONS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Placement:
    """Device and compute dtype of the networks. The F0 predictor always computes in float64."""

    device: torch.device
    dtype: torch.dtype = torch.float32  # float32 on CPU: the parity path (bf16 matmuls are slow on CPUs)

    @property
    def autocast_enabled(self) -> bool:
        """Whether the LM-independent networks run under autocast (reduced precision: CUDA in
        practice; `resolve_placement` refuses it on the CPU, but tests build CPU bfloat16 placements
        to run the same path)."""
        return self.dtype != torch.float32

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def resolve_device(spec: str = "auto") -> torch.device:
    """`auto` (CUDA when present, else CPU), `cpu`, `cuda` or `cuda:N`, with a clear error otherwise."""
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError as exc:
        raise InputError(f"unknown device {spec!r}: use auto, cpu, cuda or cuda:N") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {spec!r} requested but CUDA is not available here: use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputError(f"{spec!r}: only {torch.cuda.device_count()} CUDA device(s) present")
    elif device.type != "cpu":
        raise InputError(f"device type {device.type!r} is not supported: use auto, cpu or cuda[:N]")
    return device


def resolve_placement(device: str = "auto", precision: str = "auto") -> Placement:
    """Pick the dtype: float32 on CPU; float16 on CUDA unless asked otherwise (bf16 where supported)."""
    resolved = resolve_device(device)
    if precision == "auto":
        dtype = torch.float16 if resolved.type == "cuda" else torch.float32
    elif precision in PRECISIONS:
        dtype = PRECISIONS[precision]
    else:
        raise InputError(f"unknown precision {precision!r}: use auto, {', '.join(PRECISIONS)}")
    if resolved.type == "cpu" and dtype != torch.float32:
        raise InputError("reduced precision is only supported on CUDA; on CPU use float32 (or --preset fast)")
    return Placement(resolved, dtype)


def configure_cpu_threads(threads: int | None = None) -> int:
    """Set torch's intra-op threads to `threads`, else $COSYSERVE_THREADS, else the usable cores."""
    if threads is None and os.environ.get("COSYSERVE_THREADS", "").isdigit():
        threads = int(os.environ["COSYSERVE_THREADS"])
    if threads is None:
        try:
            threads = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            threads = os.cpu_count() or 1
    threads = max(1, int(threads))
    torch.set_num_threads(threads)
    return threads


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`tensor` on `device`. A host tensor bound for CUDA goes through pinned memory without blocking
    the host (the copy is queued on the current stream, so later work on that stream sees it); any
    other move is a plain `.to(device)`, which returns `tensor` itself when it is already there."""
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    if not tensor.is_pinned():
        tensor = tensor.pin_memory()  # the caching host allocator keeps it alive until the copy is done
    return tensor.to(device, non_blocking=True)


class _Float32Exact:
    """`float32_exact()`: float32 convolutions and matrix products without TF32 inside the block.

    cuDNN allows TF32 by default, so on Ampere and later GPUs a "float32" convolution rounds its inputs
    to 10 mantissa bits: the vocoder (float32 on purpose: its F0 and phase are sensitive) would not
    match the CPU at float32 tolerances. The flags are process-wide, so the first thread in turns TF32
    off and the last one out restores what was there before: afterwards nothing has changed.
    Meanwhile other threads' float32 work also runs without TF32 (only more exact); half-precision
    work is not affected.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._saved: tuple[bool, bool] = (False, False)

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
                torch.backends.cudnn.allow_tf32 = False
                torch.backends.cuda.matmul.allow_tf32 = False
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = self._saved


float32_exact = _Float32Exact()  # `with float32_exact():` around float32 GPU work
