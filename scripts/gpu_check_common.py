"""What the GPU check's steps share: the context they run in, their failure type, a subprocess helper."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


class CheckFailed(Exception):
    """A check found something wrong; `details` go into the report."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


@dataclass
class Context:
    """What every step gets: the options, the device and the sizes of this run."""

    dry_run: bool
    device: torch.device
    shared: Path
    work: Path  # scratch space (model directories, server data)
    sizes: dict[str, int] = field(default_factory=dict)

    @property
    def tiny_dir(self) -> Path:
        return self.shared / "parity" / "tiny"

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def subprocess_env() -> dict[str, str]:
    """This environment with this checkout's `src` first on the path: subprocesses run this code, not
    whatever cosyserve the interpreter has installed."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_json(command: list[str], timeout_s: float) -> dict[str, Any]:
    """Run `command`, return its stdout parsed as JSON; CheckFailed with its stderr's tail otherwise."""
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout_s, env=subprocess_env(), check=False
    )
    if done.returncode != 0:
        what = " ".join(command[2:5])
        raise CheckFailed(f"{what} exited {done.returncode}", {"stderr": done.stderr[-3000:]})
    return json.loads(done.stdout)


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float().cpu() - b.float().cpu()).abs().max())
