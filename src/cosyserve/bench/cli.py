"""`cosyserve bench`: the argument parser and the command. Wire it in with `add_bench_parser(sub)`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

# Kept here (not imported) so building the CLI parser does not import torch; tests check they agree
# with `cosyserve.engine.quantize.PRESETS`, `cosyserve.bench.full_random.SCALES` and the flow's steps.
PRESETS = ("exact", "fast")
SCALES = ("full", "tiny")
DEFAULT_FLOW_STEPS = 10  # `cosyserve.model.flow.DEFAULT_N_TIMESTEPS`
PRECISIONS = ("auto", "float32", "float16", "bfloat16")  # `cosyserve.engine.device.PRECISIONS` and auto

_DESCRIPTION = """\
Time one utterance through the engine: LM prefill and decoding, flow, vocoder, real-time factor,
first-chunk latency (--stream), peak memory. The token count is forced (EOS ignored), so runs are
comparable across weights and machines. --model full-random builds the real architecture with random
weights in memory: no download needed.
"""


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `bench` subcommand on an `add_subparsers()` object; returns its parser."""
    bench = subparsers.add_parser(
        "bench",
        help="measure speed and memory on this machine",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument(
        "--model", default="full-random", help="a model directory, full-random (default) or demo"
    )
    bench.add_argument("--device", default="auto", help="auto (default), cpu, cuda or cuda:N")
    bench.add_argument(
        "--preset",
        choices=PRESETS,
        default="exact",
        help="exact: float32, the parity path (default); fast: int8/float16 LLM, int8 DiT linears, "
        "bfloat16 where this CPU measures it faster (DiT, LM prefill, vocoder convolutions) "
        "(not bit-exact: its deviation from exact is measured and reported)",
    )
    bench.add_argument("--prompt-seconds", type=float, default=6.0, help="prompt length (default 6)")
    bench.add_argument("--audio-seconds", type=float, default=10.0, help="speech to generate (default 10)")
    bench.add_argument(
        "--stream", action="store_true", help="streaming synthesis; reports first-chunk latency"
    )
    bench.add_argument("--threads", type=int, default=None, help="CPU threads (default: all usable cores)")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument(
        "--scale",
        choices=SCALES,
        default="full",
        help="full-random size: full (default) or tiny (smoke test)",
    )
    bench.add_argument(
        "--flow-steps",
        type=int,
        default=DEFAULT_FLOW_STEPS,
        help="Euler steps of the flow (default 10, the exact path); fewer is faster but NOT exact: the "
        "deviation from exact is measured and reported",
    )
    bench.add_argument(
        "--no-cfg",
        action="store_true",
        help="skip classifier-free guidance in the flow (half the DiT batch); NOT exact: the deviation "
        "from exact is measured and reported",
    )
    bench.add_argument(
        "--no-deviation",
        action="store_true",
        help="fast preset, --flow-steps, --no-cfg: skip measuring the deviation from exact",
    )
    bench.add_argument(
        "--max-reuse-mb",
        type=float,
        default=None,
        help="--stream: most flow keys/values one stream keeps, in MB (its voice's prompt part included; "
        "default: the engine's); beyond it later chunks recompute (same audio, slower, less memory)",
    )
    bench.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="auto",
        help="compute dtype, as the service's setting: auto (float16 on a GPU, float32 on the CPU), "
        "float32, float16, bfloat16",
    )
    bench.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="also run this many utterances at once, as concurrent requests (on a GPU through the "
        "batching path the service uses for them); default 1",
    )
    bench.add_argument(
        "--batch",
        action="store_true",
        help="with --concurrency: decode the concurrent requests' LM steps (and run their flows) in "
        "batches on any device, the CPU too (a GPU batches them anyway)",
    )
    bench.add_argument("--no-warmup", action="store_true", help="time the very first pass too")
    bench.add_argument(
        "--json", action="store_true", help="print the report as JSON (progress goes to stderr)"
    )
    bench.set_defaults(func=run_bench_command)
    return bench


def run_bench_command(args: argparse.Namespace) -> int:
    from cosyserve.bench.report import render, to_json
    from cosyserve.bench.runner import BenchOptions, run_bench

    options = BenchOptions(
        model=args.model,
        device=args.device,
        preset=args.preset,
        prompt_seconds=args.prompt_seconds,
        audio_seconds=args.audio_seconds,
        stream=args.stream,
        threads=args.threads,
        seed=args.seed,
        scale=args.scale,
        deviation=not args.no_deviation,
        warmup=not args.no_warmup,
        flow_steps=args.flow_steps,
        no_cfg=args.no_cfg,
        max_reuse_mb=args.max_reuse_mb,
        precision=args.precision,
        concurrency=args.concurrency,
        batch=args.batch,
    )
    progress = _TerminalProgress()
    try:
        report = run_bench(options, progress)  # type: ignore[arg-type]
    finally:
        progress.close()
    print(to_json(report) if args.json else render(report), flush=True)
    return 0


class _TerminalProgress:
    """Stage lines and a token bar on stderr (tqdm), so stdout stays clean for --json.

    Has the methods of `cosyserve.bench.runner.Progress`.
    """

    def __init__(self) -> None:
        self._bar: Any = None

    def stage(self, message: str) -> None:
        self.close()
        print(f"bench: {message} ...", file=sys.stderr, flush=True)

    def tokens(self, done: int, total: int) -> None:
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, desc="speech tokens", unit="tok", file=sys.stderr, leave=False, mininterval=0.5
            )
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
