"""`scripts/gpu_check.sh --dry-run`: the GPU check's whole plan on the CPU, CUDA-only steps skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CUDA_STEPS = {"vocoder_tf32", "out_of_memory", "second_gpu", "graphs_at_start"}
PLAN = {
    "environment",
    "decode_paths",
    "stale_kv",
    "numerics",
    "finite_at_length",
    "syncs",
    "service",
    "bench",
} | CUDA_STEPS


def test_the_script_parses() -> None:
    subprocess.run(["bash", "-n", str(REPO / "scripts" / "gpu_check.sh")], check=True)


def test_dry_run_passes_and_lists_the_cuda_steps_as_skipped(shared_dir: Path, tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    env = {**os.environ, "COSYSERVE_SHARED": str(shared_dir), "GPU_CHECK_PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), "--dry-run", "--report", str(report_path),
         "--work", str(tmp_path / "work")],
        capture_output=True, text=True, env=env, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    report = json.loads(report_path.read_text())
    assert report["dry_run"] and report["passed"] and report["failed"] == []
    status = {check["name"]: check["status"] for check in report["checks"]}
    assert set(status) == PLAN
    assert {name for name, s in status.items() if s == "skipped"} == CUDA_STEPS
    assert all(s == "passed" for name, s in status.items() if name not in CUDA_STEPS)
