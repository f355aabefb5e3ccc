"""`cosyserve batch` and `cosyserve dub`: a script of lines becomes a folder of files; a subtitle file
becomes a timed voice-over. Locally (the model in this process) or against a server (`--server URL`).

Both are resumable: locally, items already in the output folder (and cues kept in `<track>.parts/` until
every cue is in the track) are skipped with `--resume`; against a server, `--resume` follows the batch
submitted before. A line or cue that cannot be spoken fails alone; the command then ends non-zero.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import soundfile as sf

from cosyserve.commands.batch_files import (
    progress_bar,
    read_input,
    read_prompt,
    report_path,
    shared_settings,
    write_atomic,
)
from cosyserve.commands.cli_labels import cli_labeller, label_bytes
from cosyserve.commands.local_cues import cue_note, cue_reader, cue_record, make_cue
from cosyserve.commands.parsing import server_url
from cosyserve.errors import CosyServeError, InputError
from cosyserve.exit_codes import ExitCode
from cosyserve.limits import DEFAULT_DUB_MAX_SPEED, SPEED_RANGE_TEXT
from cosyserve.service.audio_formats import EXTENSIONS, encode
from cosyserve.service.labels.labeller import Labeller

if TYPE_CHECKING:
    from cosyserve.service.batches.items import BatchPrompt

MANIFEST = "manifest.csv"


# -- batch ---------------------------------------------------------------------------------------------


def cmd_batch(args: argparse.Namespace) -> int:
    if args.server:
        from cosyserve.commands.batch_remote import remote_batch

        return remote_batch(args)
    from cosyserve.service.batches.inputs import BatchRules, kind_of, read_items
    from cosyserve.service.batches.items import BatchPrompt

    out = Path(args.out)
    prompt = BatchPrompt(read_prompt(args), args.prompt_text)
    rules = BatchRules(args.max_items, args.max_chars, prompt.wav is not None, shared_settings(args))
    items = read_items(read_input(args.file), kind_of(args.file), rules)
    done = _existing_rows(out, args.resume)
    from cosyserve.commands.data_dirs import default_data_dir
    from cosyserve.commands.synthesize import load_synthesizer

    synth = load_synthesizer(args)
    _require_voice(synth, args.voice)  # before any item: the server refuses it at submit too
    labels = cli_labeller(args.data_dir or default_data_dir())
    rows: list[dict[str, Any]] = []
    bar = progress_bar(len(items), "item", args.quiet)
    for position, item in enumerate(items, start=1):
        stem = f"{position:04d}_{item.name}"
        file = f"{stem}.{EXTENSIONS.get(item.params['format'], item.params['format'])}"
        if file in done:
            rows.append(done[file])
        else:
            rows.append(_make_item(synth, labels, item, prompt, out, (position, stem, file)))
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
    labels: Labeller,
    item: Any,
    prompt: BatchPrompt,
    out: Path,
    place: tuple[int, str, str],  # position, file stem, file name
) -> dict[str, Any]:
    from cosyserve.service.batches.items import ItemParams, item_request
    from cosyserve.service.quality.reporting import manifest_columns, stored_fields
    from cosyserve.service.subtitles import to_srt

    position, stem, file = place
    params = item.params
    row = {"position": position, "file": "", "name": item.name, "text": params["text"]}
    row.update(
        voice=params.get("voice") or "", seed="", duration_s="", subtitles="", state="failed", error=""
    )
    if item.problem is not None:
        return {**row, "error": item.problem}
    request = item_request(ItemParams.of(params), prompt)
    try:
        result = synth.run(request)
    except CosyServeError as exc:
        print(f"item {position}: {exc}", file=sys.stderr)
        return {**row, "error": str(exc)}
    result = labels.with_explicit(result, labels.explicit_for(synth, request, {}))
    data = encode(result.audio, params["format"], source_rate=result.sample_rate)
    write_atomic(out / file, label_bytes(labels, data, params["format"], request.voice))
    (out / f"{stem}.srt").write_text(to_srt(result.timings), encoding="utf-8")
    seconds = f"{result.duration_s:.3f}"
    return {
        **row,
        "file": file,
        "seed": result.seed,
        "duration_s": seconds,
        "subtitles": f"{stem}.srt",
        "state": "done",
        **manifest_columns(stored_fields(result.quality)),  # the kept take's checks, as a server's batch
    }


def _write_manifest(out: Path, rows: list[dict[str, Any]]) -> None:
    from cosyserve.service.batches.archive import MANIFEST_COLUMNS, rows_csv

    write_atomic(out / MANIFEST, rows_csv(MANIFEST_COLUMNS, rows).encode())


def _require_voice(synth: Any, voice: str | None) -> None:
    """VoiceNotFound for a --voice the library does not have (every item would fail with it)."""
    if voice is not None:
        synth.voices.get(voice)


def _summary(rows: list[dict[str, Any]], where: str) -> int:
    failed = [row for row in rows if row.get("state") != "done"]
    done = len(rows) - len(failed)
    if failed:
        first = failed[0]
        print(
            f"cosyserve batch: error: {done} of {len(rows)} items made in {where}; {len(failed)} failed "
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
    from cosyserve.commands.data_dirs import default_data_dir
    from cosyserve.commands.synthesize import load_synthesizer
    from cosyserve.frontend.subtitles import parse_subtitles
    from cosyserve.service.batches.inputs import BatchRules, cue_items
    from cosyserve.service.batches.items import BatchPrompt

    prompt = BatchPrompt(read_prompt(args), args.prompt_text)
    shared = {**shared_settings(args), "format": "wav"}
    rules = BatchRules(args.max_items, args.max_chars, prompt.wav is not None, shared, args.max_dub_track_s)
    items = cue_items(parse_subtitles(read_input(args.subtitles), what=args.subtitles), rules)
    out = Path(args.out)
    parts = out.with_name(out.name + ".parts")
    if parts.exists() and not args.resume:
        raise InputError(f"{parts} holds cues of an earlier run: pass --resume to go on, or delete it")
    synth = load_synthesizer(args)
    _require_voice(synth, args.voice)
    parts.mkdir(parents=True, exist_ok=True)
    bar = progress_bar(len(items), "cue", args.quiet)
    for position, item in enumerate(items, start=1):
        if cue_note(parts, position).get("state") != "done":  # not made yet, or failed: (re)made
            make_cue(synth, item, prompt, args, parts, position)
        bar.update(1)
    bar.close()
    labels = cli_labeller(args.data_dir or default_data_dir())
    return _write_dub(items, parts, out, track_format, args.report, labels)


def _track_format(out: str) -> str:
    suffix = Path(out).suffix.lower().lstrip(".")
    if suffix not in ("wav", "flac", "mp3"):
        raise InputError("--out must end in .wav, .flac or .mp3")
    return suffix


def _write_dub(
    items: list[Any], parts: Path, out: Path, track_format: str, report: str | None, labels: Labeller
) -> int:
    """The track from the cues in `parts` (written to disk as it goes, then moved over `out`) and the
    report; `parts` is removed once every cue is in the track, kept for `--resume` otherwise."""
    from cosyserve.service.batches.dub_plan import CueSlot, track_seconds_of_items
    from cosyserve.service.batches.dub_report import dub_report, report_csv, report_document, report_json

    notes = [cue_note(parts, position) for position in range(1, len(items) + 1)]
    rate = 24000
    for position, note in enumerate(notes, start=1):
        if note.get("state") == "done":
            rate = sf.info(str(parts / f"cue{position:04d}.wav")).samplerate
            break
    cues = [
        (CueSlot.of(item.params), cue_reader(parts, position, note))
        for position, (item, note) in enumerate(zip(items, notes, strict=True), start=1)
    ]
    track_s = track_seconds_of_items(item.params for item in items)
    _write_track_file(out, track_format, cues, track_s, rate, labels)
    records = [cue_record(n, item, note) for n, (item, note) in enumerate(zip(items, notes, strict=True), 1)]
    rows = dub_report(records)
    where = report_path(out, report)
    as_json = where.suffix.lower() == ".json"
    text = report_json(report_document(rows, track_s=track_s)) if as_json else report_csv(rows)
    write_atomic(where, text.encode("utf-8"))
    failed = [row for row in rows if row["state"] != "done"]
    if failed:
        print(
            f"cosyserve dub: error: wrote {out}; {len(failed)} of {len(rows)} cues failed (see {where}); "
            f"--resume makes them again from {parts}",
            file=sys.stderr,
        )
        return ExitCode.FAILED
    shutil.rmtree(parts, ignore_errors=True)
    print(f"wrote {out} ({track_s:.2f} s, {len(rows)} cues) and {where}")
    return 0


def _write_track_file(
    out: Path, track_format: str, cues: list[Any], track_s: float, rate: int, labels: Labeller
) -> None:
    """The track as a WAV written in pieces beside `out` (transcoded file to file for flac/mp3), labelled
    as AI-made, moved over `out` only once whole."""
    from cosyserve.service.audio_formats import IN_MEMORY_LIMIT_BYTES, transcode_file
    from cosyserve.service.batches.dub_track import write_track

    out.parent.mkdir(parents=True, exist_ok=True)
    wav = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.wav.tmp")
    final = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write_track(wav, cues, track_s, rate)
        if track_format == "wav":
            labels.label_wav_file(wav, None)  # in place, in blocks; its id from the samples' hash
            os.replace(wav, out)
        else:
            transcode_file(wav, final, track_format)
            if final.stat().st_size <= IN_MEMORY_LIMIT_BYTES:  # longer ones: the WAV form is labelled
                final.write_bytes(label_bytes(labels, final.read_bytes(), track_format, None))
            os.replace(final, out)
    finally:
        wav.unlink(missing_ok=True)
        final.unlink(missing_ok=True)


# -- arguments -----------------------------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser) -> None:
    from cosyserve.commands.synthesize import (
        add_model_arguments,
        add_text_limit_argument,
        add_threshold_arguments,
    )

    parser.add_argument("--voice", help="a saved voice (see `cosyserve voices`)")
    parser.add_argument("--prompt-wav", help="instead of --voice: a 3-30 s recording of the voice")
    parser.add_argument("--prompt-text", help="its transcript (zero-shot clone); omit for cross-lingual")
    parser.add_argument("--instruct", help="an instruction for every line, e.g. 请用四川话表达")
    parser.add_argument("--seed", type=int, default=None, help="one seed for every line (default: one each)")
    parser.add_argument("--speed", type=float, default=None, help=f"{SPEED_RANGE_TEXT} (default 1.0)")
    parser.add_argument("--volume", type=float, default=None, help="loudness, 0 to 4 (1: unchanged)")
    parser.add_argument(
        "--takes",
        type=int,
        default=None,
        help="takes per line while one fails its quality checks (an item's own wins; docs/quality.md)",
    )
    add_threshold_arguments(parser, "every line's (an item's own `thresholds` win one by one)")
    parser.add_argument("--resume", action="store_true", help="go on where an interrupted run stopped")
    parser.add_argument("--server", type=server_url, help="run on a cosyserve server (http://host:port)")
    parser.add_argument("--api-key", default=os.environ.get("COSYSERVE_API_KEY"), help="the server's API key")
    parser.add_argument("--max-items", type=int, default=100_000, help="refuse files with more items")
    add_text_limit_argument(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_model_arguments(parser)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    batch = sub.add_parser(
        "batch", help="speak every line of a script (CSV, JSONL, JSON or text) into a folder"
    )
    batch.add_argument("file", help=".csv with a header row (text, voice, instruct, seed, speed, volume, "
                       "format, takes, thresholds, name), .jsonl, .json, or .txt with one text "
                       "per line")  # fmt: skip
    batch.add_argument("--out", required=True, help="folder for 0001_<name>.wav ... and manifest.csv")
    batch.add_argument("--format", choices=("wav", "mp3", "flac", "opus"), default="wav")
    _common(batch)
    batch.set_defaults(func=cmd_batch)

    dub = sub.add_parser("dub", help="voice a subtitle file (SRT or WebVTT) as one timed track")
    dub.add_argument("subtitles", help="an .srt or .vtt file")
    dub.add_argument("--out", required=True, help="the track: .wav, .flac or .mp3")
    dub.add_argument("--report", help="per-cue report (.csv or .json; default <out>.report.csv)")
    dub.add_argument(
        "--max-speed",
        type=float,
        default=DEFAULT_DUB_MAX_SPEED,
        help=f"speed a cue up at most this much to fit its slot (default: {DEFAULT_DUB_MAX_SPEED})",
    )
    dub.add_argument(
        "--max-dub-track-s",
        type=float,
        default=float(os.environ.get("COSYSERVE_MAX_DUB_TRACK_S", "10800")),
        help="refuse subtitle files whose track (to the last cue's end) is longer (default 3 h; with "
        "--server, the server's max_dub_track_s applies)",
    )
    _common(dub)
    dub.set_defaults(func=cmd_dub)
