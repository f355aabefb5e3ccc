"""`cosyserve batch` and `cosyserve dub`: a script of lines becomes a folder of files; a subtitle file
becomes a timed voice-over. Locally (the model in this process) or against a server (`--server URL`).

Both are resumable: locally, items already in the output folder (and cues already made, kept beside the
track in `<track>.parts/`) are skipped with `--resume`; against a server, `--resume` follows the batch
submitted before instead of submitting it again. A line or cue that cannot be spoken fails alone; the
command then ends with a non-zero status and says how many failed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import soundfile as sf

from cosyserve.commands.batch_files import (
    progress_bar,
    read_input,
    read_prompt,
    shared_settings,
    write_atomic,
)
from cosyserve.errors import CosyServeError, InputError
from cosyserve.exit_codes import ExitCode
from cosyserve.service.audio_formats import EXTENSIONS, encode

MANIFEST = "manifest.csv"


# -- batch ---------------------------------------------------------------------------------------------


def cmd_batch(args: argparse.Namespace) -> int:
    if args.server:
        from cosyserve.commands.batch_remote import remote_batch

        return remote_batch(args)
    from cosyserve.service.batch_input import BatchRules, kind_of, read_items

    out = Path(args.out)
    prompt = read_prompt(args)
    rules = BatchRules(args.max_items, args.max_chars, prompt is not None, shared_settings(args))
    items = read_items(read_input(args.file), kind_of(args.file), rules)
    done = _existing_rows(out, args.resume)
    from cosyserve.commands.synthesize import load_synthesizer

    synth = load_synthesizer(args)
    rows: list[dict[str, Any]] = []
    bar = progress_bar(len(items), "item", args.quiet)
    for position, item in enumerate(items, start=1):
        stem = f"{position:04d}_{item.name}"
        file = f"{stem}.{EXTENSIONS.get(item.params['format'], item.params['format'])}"
        if file in done:
            rows.append(done[file])
        else:
            rows.append(_make_item(synth, item, prompt, args.prompt_text, out, position, stem, file))
            _write_manifest(out, rows)
        bar.update(1)
    bar.close()
    _write_manifest(out, rows)
    return _summary(rows, f"{out}/")


def _existing_rows(out: Path, resume: bool) -> dict[str, dict[str, Any]]:
    """Rows of the items already made in `out` (with --resume); refuses a folder with results otherwise."""
    manifest = out / MANIFEST
    if not resume:
        if manifest.exists():
            raise InputError(
                f"{out} already holds a batch's results: pass --resume to go on, or use another --out"
            )
        out.mkdir(parents=True, exist_ok=True)
        return {}
    if not manifest.exists():
        out.mkdir(parents=True, exist_ok=True)
        return {}
    with manifest.open(encoding="utf-8", newline="") as source:
        rows = list(csv.DictReader(source))
    return {row["file"]: row for row in rows if row.get("state") == "done" and (out / row["file"]).is_file()}


def _make_item(
    synth: Any,
    item: Any,
    prompt: bytes | None,
    prompt_text: str | None,
    out: Path,
    position: int,
    stem: str,
    file: str,
) -> dict[str, Any]:
    from cosyserve.service.requests import SynthesisRequest
    from cosyserve.service.subtitles import to_srt

    params = item.params
    row = {"position": position, "file": "", "name": item.name, "text": params["text"]}
    row.update(
        voice=params.get("voice") or "", seed="", duration_s="", subtitles="", state="failed", error=""
    )
    if item.problem is not None:
        return {**row, "error": item.problem}
    voice = params.get("voice")
    request = SynthesisRequest(
        text=params["text"],
        voice=voice,
        prompt_wav=None if voice else prompt,
        prompt_text=None if voice else prompt_text,
        instruct=params.get("instruct"),
        seed=params.get("seed"),
        speed=params.get("speed"),
        volume=params.get("volume", 1.0),
    )
    try:
        result = synth.run(request)
    except CosyServeError as exc:
        print(f"item {position}: {exc}", file=sys.stderr)
        return {**row, "error": str(exc)}
    write_atomic(out / file, encode(result.audio, params["format"], source_rate=result.sample_rate))
    (out / f"{stem}.srt").write_text(to_srt(result.timings), encoding="utf-8")
    seconds = f"{result.duration_s:.3f}"
    return {
        **row,
        "file": file,
        "seed": result.seed,
        "duration_s": seconds,
        "subtitles": f"{stem}.srt",
        "state": "done",
    }


def _write_manifest(out: Path, rows: list[dict[str, Any]]) -> None:
    from cosyserve.service.batch_archive import MANIFEST_COLUMNS, rows_csv

    write_atomic(out / MANIFEST, rows_csv(MANIFEST_COLUMNS, rows).encode())


def _summary(rows: list[dict[str, Any]], where: str) -> int:
    failed = [row for row in rows if row.get("state") != "done"]
    done = len(rows) - len(failed)
    if failed:
        first = failed[0]
        print(
            f"cosyserve: {done} of {len(rows)} items made in {where}; {len(failed)} failed "
            f"(item {first['position']}: {first.get('error') or first.get('state')}); see {MANIFEST}",
            file=sys.stderr,
        )
        return ExitCode.FAILED
    print(f"wrote {done} items and {MANIFEST} to {where}")
    return 0


# -- dub -----------------------------------------------------------------------------------------------


def cmd_dub(args: argparse.Namespace) -> int:
    track_format = _track_format(args.out)
    if args.server:
        from cosyserve.commands.batch_remote import remote_dub

        return remote_dub(args, track_format)
    from cosyserve.commands.synthesize import load_synthesizer
    from cosyserve.frontend.subtitles import parse_subtitles
    from cosyserve.service.batch_input import BatchRules, cue_items

    prompt = read_prompt(args)
    shared = {**shared_settings(args), "format": "wav"}
    rules = BatchRules(args.max_items, args.max_chars, prompt is not None, shared)
    items = cue_items(parse_subtitles(read_input(args.subtitles), what=args.subtitles), rules)
    out = Path(args.out)
    parts = out.with_name(out.name + ".parts")
    if parts.exists() and not args.resume:
        raise InputError(f"{parts} holds cues of an earlier run: pass --resume to go on, or delete it")
    parts.mkdir(parents=True, exist_ok=True)
    synth = load_synthesizer(args)
    bar = progress_bar(len(items), "cue", args.quiet)
    for position, item in enumerate(items, start=1):
        if not (parts / f"cue{position:04d}.json").exists():
            _make_cue(synth, item, prompt, args, parts, position)
        bar.update(1)
    bar.close()
    return _write_dub(items, parts, out, track_format, args.report)


def _track_format(out: str) -> str:
    suffix = Path(out).suffix.lower().lstrip(".")
    if suffix not in ("wav", "flac", "mp3"):
        raise InputError("--out must end in .wav, .flac or .mp3")
    return suffix


def _make_cue(
    synth: Any, item: Any, prompt: bytes | None, args: argparse.Namespace, parts: Path, position: int
) -> None:
    from cosyserve.service.local.dubbing import CueSlot, synthesize_cue
    from cosyserve.service.requests import SynthesisRequest

    params = item.params
    note: dict[str, Any] = {"state": "failed", "error": item.problem}
    if item.problem is None:
        voice = params.get("voice")
        request = SynthesisRequest(
            text=params["text"],
            voice=voice,
            prompt_wav=None if voice else prompt,
            prompt_text=None if voice else args.prompt_text,
            instruct=params.get("instruct"),
            seed=params.get("seed"),
            speed=params.get("speed"),
            volume=params.get("volume", 1.0),
        )
        try:
            cue = synthesize_cue(synth, request, CueSlot.of(params).slot_s, args.max_speed, threading.Event)
        except CosyServeError as exc:
            print(f"cue {position}: {exc}", file=sys.stderr)
            note["error"] = str(exc)
        else:
            write_atomic(
                parts / f"cue{position:04d}.wav",
                encode(cue.result.audio, "wav", source_rate=cue.result.sample_rate),
            )
            note = {"state": "done", "speed": cue.speed, "duration_s": cue.result.duration_s}
    write_atomic(parts / f"cue{position:04d}.json", json.dumps(note).encode())


def _write_dub(items: list[Any], parts: Path, out: Path, track_format: str, report: str | None) -> int:
    from cosyserve.service.batch_archive import dub_report, report_csv, report_json
    from cosyserve.service.local.dubbing import CueSlot, assemble

    cues, records, rate = [], [], 24000
    for position, item in enumerate(items, start=1):
        note = json.loads((parts / f"cue{position:04d}.json").read_text(encoding="utf-8"))
        audio = None
        if note["state"] == "done":
            audio, rate = sf.read(parts / f"cue{position:04d}.wav", dtype="float32")
        cues.append((CueSlot.of(item.params), audio))
        records.append(_record(position, item, note))
    track, _ = assemble(cues, max(slot.end_s for slot, _ in cues), rate)
    write_atomic(out, encode(track, track_format, source_rate=rate))
    rows = dub_report(records)
    report_path = Path(report) if report else out.with_suffix(".report.csv")
    text = report_json(rows) if report_path.suffix.lower() == ".json" else report_csv(rows)
    report_path.write_text(text, encoding="utf-8")
    failed = [row for row in rows if row["state"] != "done"]
    if failed:
        print(
            f"cosyserve: wrote {out}; {len(failed)} of {len(rows)} cues failed (see {report_path})",
            file=sys.stderr,
        )
        return ExitCode.FAILED
    print(f"wrote {out} ({len(track) / rate:.2f} s, {len(rows)} cues) and {report_path}")
    return 0


def _record(position: int, item: Any, note: dict[str, Any]) -> Any:
    """A cue made here as the item record the report is written from."""
    from cosyserve.service.stores.batches import BatchItem

    return BatchItem(
        batch_id="local",
        position=position,
        name=item.name,
        params=item.params,
        state=note["state"],
        error_code=None,
        error_message=note.get("error"),
        output_id=None,
        duration_s=note.get("duration_s"),
        seed=None,
        attempt=None,
        run_s=None,
        result={"speed": note.get("speed")},
        finished_at=None,
    )


# -- arguments -----------------------------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser) -> None:
    from cosyserve.commands.synthesize import add_model_arguments

    parser.add_argument("--voice", help="a saved voice (see `cosyserve voices`)")
    parser.add_argument("--prompt-wav", help="instead of --voice: a 3-30 s recording of the voice")
    parser.add_argument("--prompt-text", help="its transcript (zero-shot clone); omit for cross-lingual")
    parser.add_argument("--instruct", help="an instruction for every line, e.g. 请用四川话表达")
    parser.add_argument("--seed", type=int, default=None, help="one seed for every line (default: one each)")
    parser.add_argument("--speed", type=float, default=None, help="0.5 to 2.0 (default 1.0)")
    parser.add_argument("--volume", type=float, default=None)
    parser.add_argument("--resume", action="store_true", help="go on where an interrupted run stopped")
    parser.add_argument("--server", help="run on a cosyserve server (http://host:port) instead of here")
    parser.add_argument("--api-key", default=os.environ.get("COSYSERVE_API_KEY"), help="the server's API key")
    parser.add_argument("--max-items", type=int, default=100_000, help="refuse files with more items")
    parser.add_argument(
        "--max-chars", type=int, default=int(os.environ.get("COSYSERVE_MAX_TEXT_CHARS", "200"))
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_model_arguments(parser)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    batch = sub.add_parser(
        "batch", help="speak every line of a script (CSV, JSONL, JSON or text) into a folder"
    )
    batch.add_argument("file", help=".csv with a header row (text, voice, instruct, seed, speed, volume, "
                       "format, name), .jsonl, .json, or .txt with one text per line")  # fmt: skip
    batch.add_argument("--out", required=True, help="folder for 0001_<name>.wav ... and manifest.csv")
    batch.add_argument("--format", choices=("wav", "mp3", "flac", "opus"), default="wav")
    _common(batch)
    batch.set_defaults(func=cmd_batch)

    dub = sub.add_parser("dub", help="voice a subtitle file (SRT or WebVTT) as one timed track")
    dub.add_argument("subtitles", help="an .srt or .vtt file")
    dub.add_argument("--out", required=True, help="the track: .wav, .flac or .mp3")
    dub.add_argument("--report", help="per-cue report (.csv or .json; default <out>.report.csv)")
    dub.add_argument("--max-speed", type=float, default=1.25, help="speed a cue up at most this much to fit")
    _common(dub)
    dub.set_defaults(func=cmd_dub)
