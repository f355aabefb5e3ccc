"""What a benchmark ran on: CPU model and the vector/matrix extensions that decide CPU speed, threads,
library versions, load, and the process's peak memory."""

from __future__ import annotations

import os
import platform
import resource
import sys
from pathlib import Path
from typing import Any

import torch

from cosyserve import __version__

# Flags that change which kernels torch can use: float32 width (avx2, avx512f), int8 dot products
# (vnni), bf16 arithmetic, and Intel AMX tiles.
REPORTED_CPU_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)


def cpu_model_and_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, list[str]]:
    """CPU model name and the `REPORTED_CPU_FLAGS` it has (empty where /proc/cpuinfo is missing)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        text = cpuinfo.read_text(encoding="ascii", errors="replace")
    except OSError:
        return model, []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model, [flag for flag in REPORTED_CPU_FLAGS if flag in flags]


def peak_rss_bytes() -> int:
    """This process's peak resident memory since it started (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (empty where unsupported)."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return []


def machine_info(device: torch.device, load_at_start: list[float] | None = None) -> dict[str, Any]:
    """A JSON-ready description of the machine and software the numbers came from."""
    model, flags = cpu_model_and_flags()
    info: dict[str, Any] = {
        "cpu": model,
        "cpu_flags": flags,
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        # Other work on the machine makes every figure slower: above the thread count, expect noise.
        "load_average_at_start": load_at_start if load_at_start is not None else load_average(),
        "load_average": load_average(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cosyserve": __version__,
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def machine_line() -> str:
    """One line naming the CPU family and torch build a run used (CI prints it before the tests)."""
    model, flags = cpu_model_and_flags()
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    return (
        f"CPU: {model} [{' '.join(flags) or 'no vector flags read'}]; "
        f"torch {torch.__version__} ({build}, kernels {torch.backends.cpu.get_cpu_capability()})"
    )


if __name__ == "__main__":
    print(machine_line())
