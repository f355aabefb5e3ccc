"""How close a run came to the machine's limits.

Decoding one speech token reads every weight of the LM's decoder layers and output layer once, so its
speed is bounded by memory bandwidth; the flow's DiT passes are matrix products over all frames, bounded
by arithmetic throughput. `measure_limits` times both limits on this machine in well under a second
(a sum over a large tensor, one matrix product in the dtype the flow's products run in: float16 work
is rated against the float16 peak, float32 against float32); `efficiency` sets what the run achieved
against them. The figures are effective ones: on the fast preset the flow's int8 products count as the float32
operations they replace, so its share may exceed 100 %.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cosyserve.model.flow import CausalFlow
from cosyserve.model.speech_lm import SpeechLM

_BANDWIDTH_BYTES = 256 << 20  # at least; twice the CPU's last-level cache where larger (`bandwidth_bytes`)
_MAX_BANDWIDTH_BYTES = 2 << 30
_MATMUL_SHAPE = (1600, 1024, 1024)  # (M, K, N): one DiT projection over 2 x 800 frames
_REPEATS = 3


@dataclass(frozen=True)
class MachineLimits:
    memory_gb_s: float  # read bandwidth: a float32 sum over `bandwidth_bytes()`, best of `_REPEATS`
    matmul_gflop_s: float  # (M, K) @ (K, N) at `_MATMUL_SHAPE` in `matmul_dtype`, best of `_REPEATS`
    matmul_dtype: str = "float32"

    def to_dict(self) -> dict[str, float | str]:
        return asdict(self)


def measure_limits(device: torch.device, dtype: torch.dtype = torch.float32) -> MachineLimits:
    """Time this machine's memory bandwidth and matrix throughput in `dtype` on `device`."""
    size = bandwidth_bytes() if device.type == "cpu" else _BANDWIDTH_BYTES
    with torch.inference_mode():
        read = _best_seconds(torch.ones(size // 4, device=device).sum, device)
        m, k, n = _MATMUL_SHAPE
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        product = _best_seconds(lambda: a @ b, device)
    name = str(dtype).removeprefix("torch.")
    return MachineLimits(size / read / 1e9, 2 * m * k * n / product / 1e9, name)


def bandwidth_bytes(cache_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """Bytes to sum for the memory bandwidth: twice the largest CPU cache (some server CPUs report
    hundreds of MB of L3, and LM decoding streams 1.4 GB from memory, not from a cache), at least
    256 MB and at most 2 GB."""
    largest = 0
    for size_file in cache_dir.glob("index*/size"):
        text = size_file.read_text(encoding="ascii", errors="replace").strip().upper()
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        try:
            value = int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)
        except ValueError:
            continue
        largest = max(largest, value)
    return min(max(_BANDWIDTH_BYTES, 2 * largest), _MAX_BANDWIDTH_BYTES)


def _best_seconds(run: Callable[[], object], device: torch.device) -> float:
    run()  # first call: allocation, kernel selection
    best = float("inf")
    for _ in range(_REPEATS):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def decode_bytes_per_token(llm: SpeechLM) -> int:
    """Weight bytes one decode step reads: the decoder layers' products and the speech output layer.

    Packed layouts count their own bytes (float16 two a weight, int8 one), int8 layers one byte a
    weight. Norms, biases and the one embedding row looked up are negligible and left out.
    """
    layers = _outermost_products(llm.qwen2.layers)
    return sum(_weight_bytes(m) for m in layers) + _weight_bytes(llm.llm_decoder)


def flow_flops(flow: CausalFlow, frames: int, rows: int, steps: int) -> float:
    """Multiply-add operations x 2 of `steps` one-shot DiT passes over `frames` frames and `rows` rows
    (2 with guidance): the blocks' products, and attention's two products per head."""
    estimator = flow.decoder.estimator
    per_frame = sum(
        m.in_features * m.out_features
        for block in estimator.transformer_blocks
        for name, m in block.named_modules()
        if _is_product(m) and not name.startswith("attn_norm")  # modulation: once per pass, not per frame
    )
    config = estimator.config
    attention = 2 * config.heads * config.dim_head * frames * frames * config.depth
    return 2.0 * rows * steps * (per_frame * frames + attention)


def efficiency(
    limits: MachineLimits,
    llm: SpeechLM,
    decode_tokens_per_second: float,
    flow: CausalFlow | None,
    frames: int,
    rows: int,
    steps: int,
    flow_seconds: float,
) -> dict[str, Any]:
    """What the run achieved against `limits`; the flow part needs one-shot passes (`flow` None: left out)."""
    decode_gb_s = decode_bytes_per_token(llm) * decode_tokens_per_second / 1e9
    report: dict[str, Any] = {
        "limits": limits.to_dict(),
        "decode_gb_s": decode_gb_s,
        "decode_share_of_bandwidth": decode_gb_s / limits.memory_gb_s,
        "flow_gflop_s": None,
        "flow_share_of_matmul_peak": None,
    }
    if flow is not None and flow_seconds > 0:
        flow_gflop_s = flow_flops(flow, frames, rows, steps) / flow_seconds / 1e9
        report["flow_gflop_s"] = flow_gflop_s
        report["flow_share_of_matmul_peak"] = flow_gflop_s / limits.matmul_gflop_s
    return report


def _outermost_products(module: nn.Module) -> list[nn.Module]:
    """Product modules under `module`, not descending into one (a packed int8 layer holds another)."""
    if _is_product(module):
        return [module]
    return [found for child in module.children() for found in _outermost_products(child)]


def _is_product(module: nn.Module) -> bool:
    return hasattr(module, "in_features") and hasattr(module, "out_features")


def _weight_bytes(module: nn.Module) -> int:
    packed = getattr(module, "weight_nbytes", None)  # `linear_kernels.PackedLinear`: its layout's bytes
    if isinstance(packed, int):
        return packed
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight.numel() * weight.element_size()
    return int(module.in_features) * int(module.out_features)  # int8: one byte a weight
