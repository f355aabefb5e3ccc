"""The GPU check: one unattended run on a new GPU server before it is opened to users (issue 21).

    python scripts/gpu_check.py [--dry-run] [--report FILE] [--shared DIR] [--device cuda:0]

(`scripts/gpu_check.sh` installs what this needs on a bare machine, then runs it.) It runs a fixed
plan of checks, writes one JSON report and exits non-zero when any check failed. `--dry-run` runs the
same plan on the CPU with small sizes: the CUDA-only steps are listed as skipped, the rest run, so the
plan itself is tested in CI.

The steps (numerics on the tiny parity model of `../shared/parity/tiny` and the full-size random
architecture; the service on the demo model):
- environment: GPUs, torch, one onnxruntime distribution whose CUDA provider really loads;
- decode_paths: CUDA-graph and batched LM log-probs against eager, in float16 and bfloat16;
- stale_kv, graphs_at_start: `gpu_check_serving.py` (reused KV buffers left full of NaN change
  nothing; every CUDA graph captured when the engine starts, none while serving);
- numerics: teacher-forced CPU float32 vs GPU float32 vs GPU float16 (LM |d logp| and top-1
  agreement, flow |d mel|, the vocoder with TF32 on and off), finite values at 3000 LM positions and
  1500 mel frames;
- syncs: host synchronisations per LM token and per flow pass (`torch.cuda.set_sync_debug_mode`);
- service, out_of_memory: `gpu_check_service.py`;
- bench: `cosyserve bench` in float32, float16, streaming, and 4 and 16 requests at once;
- second_gpu: the graph path on cuda:1, when there is one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO / "src")]

import gpu_check_numerics as numerics  # noqa: E402
import gpu_check_service as service  # noqa: E402
import gpu_check_serving as serving  # noqa: E402
import torch  # noqa: E402
from gpu_check_common import CheckFailed, Context, run_json  # noqa: E402

# Full runs on a datacenter GPU; dry runs small enough for CI on two cores.
SIZES = {
    "full": {"lm_positions": 3000, "mel_frames": 1500, "decode_steps": 64, "requests": 50, "clients": 8,
             "bench_audio_seconds": 5, "sync_tokens": 32},
    "dry": {"lm_positions": 300, "mel_frames": 150, "decode_steps": 8, "requests": 6, "clients": 3,
            "bench_audio_seconds": 1, "sync_tokens": 8},
}  # fmt: skip


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[Context], dict[str, Any]]
    needs_cuda: bool = False  # skipped in a dry run (and on a machine without CUDA)
    needs_gpus: int = 1


def plan() -> list[Step]:
    return [
        Step("environment", environment),
        Step("decode_paths", numerics.decode_paths),
        Step("stale_kv", serving.stale_kv),
        Step("graphs_at_start", serving.graphs_at_start, needs_cuda=True),
        Step("numerics", numerics.teacher_forced),
        Step("vocoder_tf32", numerics.vocoder_tf32, needs_cuda=True),
        Step("finite_at_length", numerics.finite_at_length),
        Step("syncs", numerics.syncs),
        Step("service", service.service_load),
        Step("out_of_memory", service.out_of_memory, needs_cuda=True),
        Step("bench", bench),
        Step("second_gpu", numerics.second_gpu, needs_cuda=True, needs_gpus=2),
    ]


def environment(ctx: Context) -> dict[str, Any]:
    """GPUs and libraries; one distribution owns onnxruntime, and on a GPU its CUDA provider loads."""
    from cosyserve.frontend.onnx_models import SpeakerEncoder, onnxruntime_distributions
    from cosyserve.frontend.standin_onnx import write_campplus_standin

    details: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if ctx.cuda else [],
        "onnxruntime_distributions": onnxruntime_distributions(),
    }
    if len(details["onnxruntime_distributions"]) != 1:
        raise CheckFailed(
            "not exactly one distribution owns onnxruntime (they overwrite each other)", details
        )
    path = ctx.work / "campplus.onnx"
    write_campplus_standin(path, seed=0)
    encoder = SpeakerEncoder(path, device=str(ctx.device) if ctx.cuda else "cpu", intra_op_threads=1)
    details["onnx_providers"] = encoder.providers
    details["onnx_device"] = encoder.device
    if ctx.cuda and encoder.device != str(ctx.device):
        raise CheckFailed(
            f"onnxruntime runs the prompt models on {encoder.device}, not {ctx.device}", details
        )
    return details


def bench(ctx: Context) -> dict[str, Any]:
    """`cosyserve bench` as a user runs it: exact float32, the default float16, streaming first chunk,
    and 4 and 16 requests at once through the batching engine (CPU dry run: tiny, float32 once, 2 at
    once)."""
    seconds = str(ctx.sizes["bench_audio_seconds"])
    common = ["--json", "--audio-seconds", seconds, "--prompt-seconds", "3", "--device", str(ctx.device)]
    common += ["--scale", "full"] if ctx.cuda else ["--scale", "tiny", "--threads", "1"]
    runs = {
        "float32": ["--precision", "float32"],
        "default_precision": [],
        "stream": ["--stream"],
        "concurrency_4": ["--concurrency", "4" if ctx.cuda else "2"],
        "concurrency_16": ["--concurrency", "16"],
    }
    if not ctx.cuda:  # the CPU's default precision is float32: the same run twice; 16 at once is for a GPU
        del runs["default_precision"], runs["concurrency_16"]
    results = {}
    for name, extra in runs.items():
        report = run_json([sys.executable, "-m", "cosyserve.cli", "bench", *common, *extra], 300)
        results[name] = {
            "dtype": report["dtype"],
            "real_time_factor": report["real_time_factor"],
            "decode_tokens_per_second": report["decode_tokens_per_second"],
            "first_chunk_seconds": report["first_chunk_seconds"],
            "peak_gpu_bytes": report.get("peak_gpu_bytes"),
            "flow_share_of_matmul_peak": report["efficiency"]["flow_share_of_matmul_peak"],
            "concurrent": report["concurrent"],
            "engine_options": report["engine_options"],
        }
    if ctx.cuda and results["concurrency_4"]["concurrent"]["decode_rows_per_batch"] in (None, 1.0):
        raise CheckFailed("4 concurrent requests never shared a decode step", results)
    return results


def run_step(step: Step, ctx: Context) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": step.name, "needs_cuda": step.needs_cuda}
    gpus = torch.cuda.device_count() if ctx.cuda else 0
    if step.needs_cuda and not ctx.cuda:
        return {**entry, "status": "skipped", "reason": "needs CUDA (dry run or no GPU)"}
    if gpus < step.needs_gpus and step.needs_cuda:
        return {**entry, "status": "skipped", "reason": f"needs {step.needs_gpus} GPUs, found {gpus}"}
    started = time.perf_counter()
    try:
        details = step.run(ctx)
        entry.update(status="passed", details=details)
    except CheckFailed as exc:
        entry.update(status="failed", reason=str(exc), details=exc.details)
    except Exception as exc:  # a crash is a failed check, with what is needed to see why
        entry.update(status="failed", reason=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    entry["seconds"] = round(time.perf_counter() - started, 2)
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="the same plan on the CPU, CUDA steps skipped")
    parser.add_argument("--device", default="cuda:0", help="the GPU to check (default cuda:0)")
    parser.add_argument(
        "--shared", type=Path, default=Path(os.environ.get("COSYSERVE_SHARED", REPO.parent / "shared"))
    )
    parser.add_argument("--report", type=Path, default=Path("gpu_check_report.json"))
    parser.add_argument(
        "--work", type=Path, default=None, help="scratch directory (default: a temporary one)"
    )
    parser.add_argument("--only", nargs="*", default=None, help="run only these steps")
    args = parser.parse_args(argv)
    import tempfile

    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu_check: CUDA is not available here; use --dry-run on a machine without a GPU", file=sys.stderr
        )
        return 2
    device = torch.device("cpu" if args.dry_run else args.device)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        ctx = Context(args.dry_run, device, args.shared, args.work or Path(tmp))
        ctx.work.mkdir(parents=True, exist_ok=True)
        ctx.sizes = SIZES["dry" if args.dry_run else "full"]
        return _run(ctx, args)


def _run(ctx: Context, args: argparse.Namespace) -> int:
    started = time.time()
    entries = []
    for step in plan():
        if args.only is not None and step.name not in args.only:
            continue
        print(f"gpu_check: {step.name} ...", file=sys.stderr, flush=True)
        entry = run_step(step, ctx)
        print(
            f"gpu_check: {step.name}: {entry['status']} {entry.get('reason', '')}",
            file=sys.stderr,
            flush=True,
        )
        entries.append(entry)
    failed = [e["name"] for e in entries if e["status"] == "failed"]
    report = {
        "dry_run": ctx.dry_run,
        "device": str(ctx.device),
        "machine": {"host": platform.node(), "python": platform.python_version(), "torch": torch.__version__},
        "sizes": ctx.sizes,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "seconds": round(time.time() - started, 1),
        "checks": entries,
        "failed": failed,
        "passed": not failed,
    }
    args.report.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    print(f"gpu_check: {'PASSED' if not failed else 'FAILED: ' + ', '.join(failed)}; report {args.report}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
