"""bfloat16 matrix products where the CPU has units for them (AMX, AVX-512 BF16): measured, not assumed.

A large product (the DiT's, `SHAPE`) runs in float32 and in bfloat16 on this machine's threads; the
fast preset moves the DiT's linears to bfloat16 only when bfloat16 is clearly faster (`MIN_SPEEDUP`).
A CPU without those flags is not measured: torch's fallback there runs bfloat16 products tens of times
slower than float32 (an AVX2 EPYC: 0.1 vs 7.7 GFLOP/s on 2 busy threads), and timing it would take
seconds. The answer is cached beside the LM's kernel calibration (`calibration.Calibration`), under the
same machine key (CPU model and flags, torch, threads, instruction caps).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosyserve.engine.calibration import Calibration, cpu_flags

log = logging.getLogger(__name__)

SHAPE = (1600, 1024, 1024)  # (rows, in, out): a DiT product over 1600 frames
MIN_SPEEDUP = 1.3  # bfloat16 must beat float32 by this much to be worth its rounding
REPEATS = 3  # each dtype keeps its best timing
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # CPU flags of units that multiply bfloat16 natively


@dataclass(frozen=True)
class MatmulSpeed:
    """One product of `SHAPE` in float32 and bfloat16 on this machine (GFLOP/s; 0: not measured)."""

    float32_gflops: float
    bfloat16_gflops: float
    units: tuple[str, ...]  # the flags of `BF16_FLAGS` this CPU reports
    shape: tuple[int, int, int] = SHAPE

    @property
    def speedup(self) -> float:
        return self.bfloat16_gflops / self.float32_gflops if self.float32_gflops > 0 else 0.0

    @property
    def use_bfloat16(self) -> bool:
        return bool(self.units) and self.speedup >= MIN_SPEEDUP

    def describe(self) -> str:
        if not self.units:
            return "no bfloat16 matrix units (amx_bf16/avx512_bf16): float32/int8 products"
        return (
            f"{'x'.join(map(str, self.shape))} product: float32 {self.float32_gflops:.0f} GFLOP/s, "
            f"bfloat16 {self.bfloat16_gflops:.0f} GFLOP/s ({self.speedup:.1f}x, {', '.join(self.units)})"
        )

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "speedup": self.speedup, "use_bfloat16": self.use_bfloat16}


def bf16_units(flags: Sequence[str] | None = None) -> tuple[str, ...]:
    """The bfloat16 matrix-unit flags among `flags` (default: this CPU's)."""
    present = set(cpu_flags() if flags is None else flags)
    return tuple(flag for flag in BF16_FLAGS if flag in present)


def matmul_gflops(dtype: torch.dtype, shape: tuple[int, int, int] = SHAPE, repeats: int = REPEATS) -> float:
    """Best-of-`repeats` GFLOP/s of one `shape` product in `dtype` on the current threads."""
    rows, inner, out = shape
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(rows, inner, generator=generator).to(dtype)
    b = torch.randn(inner, out, generator=generator).to(dtype)
    torch.matmul(a, b)  # first call: kernel selection, packing buffers
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - started)
    return 2 * rows * inner * out / best / 1e9


def measure(
    units: tuple[str, ...] | None = None, gflops: Callable[..., float] = matmul_gflops
) -> MatmulSpeed:
    """This machine's `MatmulSpeed`; bfloat16 is timed only where the CPU has units for it."""
    units = bf16_units() if units is None else units
    if not units:
        return MatmulSpeed(0.0, 0.0, ())
    return MatmulSpeed(gflops(torch.float32), gflops(torch.bfloat16), units)


def matmul_speed(calibration: Calibration, measure_speed: Callable[[], MatmulSpeed] = measure) -> MatmulSpeed:
    """The cached `MatmulSpeed` of this machine (`calibration`'s key and directory), else measured
    and cached; memory only when `calibration` has no directory."""
    path = _cache_path(calibration)
    cached = _read(path, calibration.key)
    if cached is not None:
        return cached
    started = time.perf_counter()
    speed = measure_speed()
    calibration.measured_seconds += time.perf_counter() - started
    log.info("calibration: %s", speed.describe())
    if path is not None:
        _write(path, calibration.key, speed)
    return speed


class BFloat16Linear(nn.Module):
    """An `nn.Linear` whose product runs in bfloat16 (weights stored so); float32 in and out, the bias
    added in float32. `x` `(..., in)` -> `(..., out)`."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", linear.weight.detach().to(torch.bfloat16), persistent=False)
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        out = F.linear(x.to(torch.bfloat16), self.weight).to(x.dtype)
        return out if self.bias is None else out + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bfloat16"


def _cache_path(calibration: Calibration) -> Path | None:
    if calibration.path is None:
        return None
    digest = hashlib.sha256(json.dumps(calibration.key, sort_keys=True).encode()).hexdigest()[:20]
    return calibration.path.parent / f"matmul-{digest}.json"


def _read(path: Path | None, key: dict[str, object]) -> MatmulSpeed | None:
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("key") != json.loads(json.dumps(key)):
            return None
        speed = data["speed"]
        return MatmulSpeed(
            float(speed["float32_gflops"]),
            float(speed["bfloat16_gflops"]),
            tuple(speed["units"]),
            tuple(speed["shape"]),  # type: ignore[arg-type]
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        log.warning("calibration: %s is unreadable; measuring again", path)
        return None


def _write(path: Path, key: dict[str, object], speed: MatmulSpeed) -> None:
    payload = json.dumps({"key": key, "speed": asdict(speed)}, indent=1, sort_keys=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=path.parent, prefix=".matmul-", suffix=".tmp", delete=False, encoding="utf-8"
        ) as tmp:
            tmp.write(payload)
        os.replace(tmp.name, path)
    except OSError as exc:
        log.warning("calibration: cannot write %s (%s); measuring again at the next start", path, exc)
