"""The GPUs of this machine as NVML reports them: name, utilisation, memory and temperature.

NVML (`nvidia-ml-py`, imported as `pynvml`) reads the driver's counters without creating a CUDA context,
so an API-only node, a process whose CUDA context hit a sticky error, or a machine without a GPU all
answer the same way: a list of what is there, possibly empty, never an exception. The admin tab and
`/metrics` show the same `GpuStats`.
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuStats:
    """One GPU at the moment it was read; a figure the driver would not give is None."""

    index: int
    name: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization: float | None  # busy fraction over the driver's last sample period, 0..1
    temperature_c: float | None

    @property
    def memory_free_bytes(self) -> int:
        return max(0, self.memory_total_bytes - self.memory_used_bytes)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "memory_free_bytes": self.memory_free_bytes}


@dataclass(frozen=True)
class GpuReport:
    """What NVML said: the GPUs, or why there are none to show (`absent_reason`)."""

    gpus: tuple[GpuStats, ...]
    absent_reason: str | None = None  # "nvidia-ml-py is not installed", "no NVIDIA driver", ...


class NvmlReader:
    """Reads NVML, initialising it once; `module` replaces `pynvml` (tests pass a fake)."""

    def __init__(self, module: ModuleType | Any | None = None) -> None:
        self._module = module
        self._lock = threading.Lock()
        self._initialised = False
        self._failed: str | None = None

    def read(self) -> GpuReport:
        """Every GPU NVML sees; an empty report with the reason when there is none or NVML fails."""
        with self._lock:
            nvml = self._nvml()
            if nvml is None:
                return GpuReport((), self._failed)
            try:
                count = nvml.nvmlDeviceGetCount()
                gpus = tuple(_read_one(nvml, index) for index in range(count))
            except Exception as exc:  # a driver that went away: report it, try again next time
                return GpuReport((), f"NVML failed: {exc}")
        return GpuReport(gpus, None if gpus else "NVML sees no GPU")

    def _nvml(self) -> Any:
        if self._failed is not None:
            return None
        module = self._module
        if module is None:
            try:
                module = importlib.import_module("pynvml")
            except ImportError:
                self._failed = "nvidia-ml-py is not installed"
                return None
        if not self._initialised:
            try:
                module.nvmlInit()
            except Exception as exc:  # no driver (no GPU, a container without the device): stop asking
                self._failed = f"no NVIDIA driver ({exc})"
                return None
            self._initialised = True
        self._module = module
        return module


def _read_one(nvml: Any, index: int) -> GpuStats:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    name = nvml.nvmlDeviceGetName(handle)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    return GpuStats(
        index=index,
        name=name.decode() if isinstance(name, bytes) else str(name),
        memory_used_bytes=int(memory.used),
        memory_total_bytes=int(memory.total),
        utilization=_optional(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0),
        temperature_c=_optional(
            lambda: float(nvml.nvmlDeviceGetTemperature(handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)))
        ),
    )


def _optional(read: Any) -> float | None:
    """A figure some GPUs do not report (MIG slices have no utilisation): None instead of failing."""
    try:
        return float(read())
    except Exception:
        return None


_default = NvmlReader()


def gpu_report() -> GpuReport:
    """This machine's GPUs through the process-wide reader."""
    return _default.read()


def engine_allocator(device: str | None) -> dict[str, float] | None:
    """PyTorch's own figures for the engine's CUDA device (`cuda:1`), in MB; None when the engine is not on
    a GPU, torch is not loaded, or its CUDA context is unusable. Never creates a context elsewhere."""
    if not device or not device.startswith("cuda"):
        return None
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        return {
            "allocated_mb": round(torch.cuda.memory_allocated(device) / 2**20, 1),
            "reserved_mb": round(torch.cuda.memory_reserved(device) / 2**20, 1),
        }
    except Exception as exc:  # a sticky CUDA error: the admin page still answers
        log.debug("allocator figures of %s unavailable: %s", device, exc)
        return None
