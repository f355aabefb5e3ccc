"""bfloat16 products where the CPU has units for them (AMX, AVX-512 BF16): measured, not assumed.

On this machine's threads, a large product (the DiT's, `SHAPE`) runs in float32, bfloat16 and int8
(fbgemm), and a vocoder convolution (`CONV_SHAPE`) in float32 and bfloat16. The fast preset uses
bfloat16 for
- the DiT (its linears, attention and feed-forward hidden layer: `bfloat16_dit`) when bfloat16 is
  clearly faster than float32 (`MIN_SPEEDUP`) and about as fast as int8 or faster (`INT8_MARGIN`:
  bfloat16 is the closer of the two), else int8 linears;
- the LM's prefill (many rows) in the decoder layers: where their decode kernel is int8, by the same
  rule; where it is float16 (fbgemm's float16 product runs many rows at about float32's speed), when
  bfloat16 is clearly faster than float32;
- the vocoder's convolutions when a bfloat16 convolution is clearly faster than a float32 one;
- the DiT's attention alone, where its linears stay int8, when the compiled bfloat16 attention
  (`native_dit_attention`) is clearly faster than the float32 one.
An AVX-512 EPYC with avx512_bf16 and VNNI but no AMX runs the DiT product about 2.2x faster in
bfloat16 than float32 yet 1.8x faster still in int8, so there the DiT's linears stay int8, and its
attention runs in bfloat16 (34 against 17-20 ms a call).
`COSYSERVE_BFLOAT16` overrides the measured choice, for comparisons (`bfloat16_override`).
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosyserve.engine.calibration import Calibration, cpu_flags
from cosyserve.engine.linear_kernels import INT8_KERNELS
from cosyserve.engine.native_dit_attention import HEAD_DIM, BFloat16Attention, bfloat16_attention_available
from cosyserve.errors import InputError

log = logging.getLogger(__name__)

SHAPE = (1600, 1024, 1024)  # (rows, in, out): a DiT product over 1600 frames
ATTENTION_SHAPE = (2, 16, 800)  # (batch, heads, frames): a guided one-shot DiT pass over 800 frames
CONV_SHAPE = (128, 10000, 7)  # (channels in and out, frames, kernel): a vocoder resblock convolution
MIN_SPEEDUP = 1.3  # bfloat16 must beat float32 by this much to be worth its rounding
INT8_MARGIN = 0.9  # bfloat16 (8 significant bits per value) is kept over int8 down to this speed ratio
REPEATS = 5  # each dtype keeps its best timing (3 let one busy moment on a shared machine
# halve int8's figure and flip the DiT's choice)
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # CPU flags of units that multiply bfloat16 natively
CACHE_FORMAT = 3  # 2: int8 and convolution speeds too; 3: the DiT's attention
PARTS = ("dit", "prefill", "vocoder", "attention")  # what the fast preset may run in bfloat16
OVERRIDE_ENV = "COSYSERVE_BFLOAT16"  # auto (measured), none, or a comma list of PARTS forced to bfloat16


@dataclass(frozen=True)
class MatmulSpeed:
    """One product of `SHAPE` in float32 and bfloat16 on this machine (GFLOP/s; 0: not measured)."""

    float32_gflops: float
    bfloat16_gflops: float
    units: tuple[str, ...]  # the flags of `BF16_FLAGS` this CPU reports
    shape: tuple[int, int, int] = SHAPE
    int8_gflops: float = 0.0  # the same product in int8 (fbgemm); 0: not measured (no int8 kernels)
    conv_float32_gflops: float = 0.0  # a `CONV_SHAPE` convolution; 0: not measured
    conv_bfloat16_gflops: float = 0.0
    attention_float32_ms: float = 0.0  # one DiT attention (`ATTENTION_SHAPE`); 0: not
    attention_bfloat16_ms: float = 0.0  # measured (the compiled bfloat16 one: not available here)

    @property
    def speedup(self) -> float:
        return self.bfloat16_gflops / self.float32_gflops if self.float32_gflops > 0 else 0.0

    @property
    def conv_speedup(self) -> float:
        return self.conv_bfloat16_gflops / self.conv_float32_gflops if self.conv_float32_gflops > 0 else 0.0

    @property
    def attention_speedup(self) -> float:
        if self.attention_bfloat16_ms <= 0:
            return 0.0
        return self.attention_float32_ms / self.attention_bfloat16_ms

    @property
    def beats_float32(self) -> bool:
        return bool(self.units) and self.speedup >= MIN_SPEEDUP

    @property
    def use_bfloat16(self) -> bool:
        """bfloat16 rather than int8 for large products (the DiT's linears, prefill of int8 layers)."""
        return self.beats_float32 and self.bfloat16_gflops >= INT8_MARGIN * self.int8_gflops

    @property
    def use_bfloat16_conv(self) -> bool:
        return bool(self.units) and self.conv_speedup >= MIN_SPEEDUP

    @property
    def use_bfloat16_attention(self) -> bool:
        """The compiled bfloat16 attention for a DiT whose linears stay int8 (a bfloat16 DiT has its
        own bfloat16 attention)."""
        return bool(self.units) and not self.use_bfloat16 and self.attention_speedup >= MIN_SPEEDUP

    def prefill_in_bfloat16(self, decode_kernel: str) -> bool:
        """Whether an LM product whose one-row kernel is `decode_kernel` runs many rows in bfloat16."""
        if decode_kernel in INT8_KERNELS:
            return self.use_bfloat16
        return decode_kernel == "fp16" and self.beats_float32

    def describe(self) -> str:
        if not self.units:
            return "no bfloat16 matrix units (amx_bf16/avx512_bf16): float32/int8 products"
        int8 = f", int8 {self.int8_gflops:.0f}" if self.int8_gflops > 0 else ""
        conv = ""
        if self.conv_float32_gflops > 0:
            conv = (
                f"; conv {self.conv_float32_gflops:.0f} vs {self.conv_bfloat16_gflops:.0f} GFLOP/s "
                f"({self.conv_speedup:.1f}x)"
            )
        if self.attention_bfloat16_ms > 0:
            conv += (
                f"; attention {self.attention_float32_ms:.0f} vs {self.attention_bfloat16_ms:.0f} ms "
                f"({self.attention_speedup:.1f}x)"
            )
        return (
            f"{'x'.join(map(str, self.shape))} product: float32 {self.float32_gflops:.0f} GFLOP/s, "
            f"bfloat16 {self.bfloat16_gflops:.0f} GFLOP/s ({self.speedup:.1f}x{int8}){conv}; "
            f"{', '.join(self.units)}"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            **asdict(self),
            "speedup": self.speedup,
            "conv_speedup": self.conv_speedup,
            "use_bfloat16": self.use_bfloat16,
            "use_bfloat16_conv": self.use_bfloat16_conv,
            "attention_speedup": self.attention_speedup,
            "use_bfloat16_attention": self.use_bfloat16_attention,
        }


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
    return 2 * rows * inner * out / _best_seconds(lambda: torch.matmul(a, b), repeats) / 1e9


def int8_gflops(shape: tuple[int, int, int] = SHAPE, repeats: int = REPEATS) -> float:
    """Best-of-`repeats` GFLOP/s of one `shape` product through `Int8Linear` (0 without fbgemm)."""
    from cosyserve.engine.int8 import Int8Linear, int8_available

    if not int8_available():
        return 0.0
    rows, inner, out = shape
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, inner, generator=generator)
    linear = Int8Linear.from_weight(torch.randn(out, inner, generator=generator), None)
    return 2 * rows * inner * out / _best_seconds(lambda: linear(x), repeats) / 1e9


def conv_gflops(
    dtype: torch.dtype, shape: tuple[int, int, int] = CONV_SHAPE, repeats: int = REPEATS
) -> float:
    """Best-of-`repeats` GFLOP/s of one `shape` convolution in `dtype`, float32 in and out (the casts
    count, as they do in the vocoder)."""
    channels, frames, kernel = shape
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, channels, frames + kernel - 1, generator=generator)
    weight = torch.randn(channels, channels, kernel, generator=generator).to(dtype)
    seconds = _best_seconds(lambda: F.conv1d(x.to(dtype), weight).float(), repeats)
    return 2 * channels * channels * kernel * frames / seconds / 1e9


def attention_milliseconds(repeats: int = REPEATS) -> tuple[float, float]:
    """Best-of-`repeats` milliseconds of one `ATTENTION_SHAPE` attention: float32 SDPA (as the DiT calls
    it, its output laid out for the next product) and the compiled bfloat16 one (`native_dit_attention`;
    0.0: it does not run here)."""
    batch, heads, frames = ATTENTION_SHAPE
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(batch, frames, heads, HEAD_DIM, generator=generator).transpose(1, 2) for _ in range(3)
    )

    def float32() -> Tensor:
        out = F.scaled_dot_product_attention(q, k, v)
        return out.transpose(1, 2).reshape(batch, frames, heads * HEAD_DIM)

    kernel = BFloat16Attention()
    with torch.inference_mode():
        compiled = _best_seconds(lambda: kernel(q, k, v), repeats) if bfloat16_attention_available() else 0.0
        return _best_seconds(float32, repeats) * 1e3, compiled * 1e3


def _best_seconds(run: Callable[[], object], repeats: int) -> float:
    run()  # first call: kernel selection, packing buffers
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def measure(
    units: tuple[str, ...] | None = None,
    gflops: Callable[..., float] = matmul_gflops,
    int8: Callable[[], float] = int8_gflops,
    conv: Callable[..., float] = conv_gflops,
    attention: Callable[[], tuple[float, float]] = attention_milliseconds,
) -> MatmulSpeed:
    """This machine's `MatmulSpeed`; nothing is timed where the CPU has no bfloat16 units."""
    units = bf16_units() if units is None else units
    if not units:
        return MatmulSpeed(0.0, 0.0, ())
    attention_float32_ms, attention_bfloat16_ms = attention()
    return MatmulSpeed(
        gflops(torch.float32),
        gflops(torch.bfloat16),
        units,
        int8_gflops=int8(),
        conv_float32_gflops=conv(torch.float32),
        conv_bfloat16_gflops=conv(torch.bfloat16),
        attention_float32_ms=attention_float32_ms,
        attention_bfloat16_ms=attention_bfloat16_ms,
    )


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


class BFloat16Conv(nn.Module):
    """A vocoder convolution module (its padding and upsampling included) run in bfloat16: weights
    stored so, the input cast in and the output cast back. `(B, C_in, T)` -> `(B, C_out, T')`, float32."""

    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.conv = conv.to(torch.bfloat16)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x.to(torch.bfloat16)).to(x.dtype)


def bfloat16_override(environ: Mapping[str, str] | None = None) -> frozenset[str] | None:
    """The parts `OVERRIDE_ENV` forces to bfloat16 (the others stay as without bfloat16 units), or None
    to follow the measurement."""
    value = (os.environ if environ is None else environ).get(OVERRIDE_ENV, "auto").strip().lower()
    if value in ("", "auto"):
        return None
    if value == "none":
        return frozenset()
    parts = frozenset(part.strip() for part in value.split(","))
    unknown = sorted(parts - set(PARTS))
    if unknown:
        raise InputError(
            f"{OVERRIDE_ENV}={value!r}: use auto, none or a comma list of {', '.join(PARTS)} "
            f"(unknown: {', '.join(unknown)})"
        )
    return parts


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
        if data.get("format") != CACHE_FORMAT:  # written before int8, convolutions or attention were measured
            return None
        return MatmulSpeed(
            float(speed["float32_gflops"]),
            float(speed["bfloat16_gflops"]),
            tuple(speed["units"]),
            tuple(speed["shape"]),  # type: ignore[arg-type]
            float(speed["int8_gflops"]),
            float(speed["conv_float32_gflops"]),
            float(speed["conv_bfloat16_gflops"]),
            float(speed["attention_float32_ms"]),
            float(speed["attention_bfloat16_ms"]),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        log.warning("calibration: %s is unreadable; measuring again", path)
        return None


def _write(path: Path, key: dict[str, object], speed: MatmulSpeed) -> None:
    payload = json.dumps(
        {"format": CACHE_FORMAT, "key": key, "speed": asdict(speed)}, indent=1, sort_keys=True
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=path.parent, prefix=".matmul-", suffix=".tmp", delete=False, encoding="utf-8"
        ) as tmp:
            tmp.write(payload)
        os.replace(tmp.name, path)
    except OSError as exc:
        log.warning("calibration: cannot write %s (%s); measuring again at the next start", path, exc)
