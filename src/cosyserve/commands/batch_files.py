"""What `cosyserve batch` and `cosyserve dub` share, locally and against a server: their settings, the
files they read, a progress bar, and files written whole or not at all."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from cosyserve.commands.synthesize import threshold_arguments
from cosyserve.errors import InputError


def shared_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "voice": args.voice,
        "instruct": args.instruct,
        "seed": args.seed,
        "speed": args.speed,
        "volume": args.volume,
        "takes": args.takes,
        "thresholds": threshold_arguments(args) or None,
        "format": getattr(args, "format", None) or "wav",
        "prompt_text": args.prompt_text,
    }


def read_prompt(args: argparse.Namespace) -> bytes | None:
    if args.prompt_wav is None:
        return None
    try:
        return Path(args.prompt_wav).read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read --prompt-wav {args.prompt_wav}: {exc.strerror}") from exc


def read_input(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc


def progress_bar(total: int, unit: str, quiet: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, file=sys.stderr, disable=quiet, dynamic_ncols=True)


def write_atomic(path: Path, data: bytes) -> None:
    """A file that is either whole or absent (so `--resume` never takes a half-written one for done)."""
    temp = path.with_name(f".{path.name}.part")
    temp.write_bytes(data)
    os.replace(temp, path)


def report_path(out: Path, report: str | None) -> Path:
    """Where the dub's report goes: `--report`, else beside the track as `<track>.report.csv` (like
    `<track>.parts/`), so two tracks of one subtitle file (`ep.wav`, `ep.mp3`) keep a report each."""
    return Path(report) if report else out.with_name(out.name + ".report.csv")
