"""The cues of a local `cosyserve dub`: each made once and kept beside the track as a WAV and a note (its
state, speed and scores), so `--resume` makes only those missing; read back into the track and the
report."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import soundfile as sf

from cosyserve.commands.batch_files import write_atomic
from cosyserve.errors import CosyServeError
from cosyserve.service.audio_formats import encode

if TYPE_CHECKING:
    from cosyserve.service.batches.items import BatchPrompt


def cue_note(parts: Path, position: int) -> dict[str, Any]:
    """What an earlier run noted about a cue ({} when it has not run, or its audio is gone)."""
    note_path = parts / f"cue{position:04d}.json"
    if not note_path.exists():
        return {}
    note = json.loads(note_path.read_text(encoding="utf-8"))
    if note.get("state") == "done" and not (parts / f"cue{position:04d}.wav").exists():
        return {}
    return note


def make_cue(
    synth: Any, item: Any, prompt: BatchPrompt, args: argparse.Namespace, parts: Path, position: int
) -> None:
    from cosyserve.service.batches.items import ItemParams, item_request
    from cosyserve.service.local.dubbing import CueSlot, synthesize_cue
    from cosyserve.service.quality.reporting import stored_fields

    params = item.params
    note: dict[str, Any] = {"state": "failed", "error": item.problem}
    if item.problem is None:
        request = item_request(ItemParams.of(params), prompt)
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
            note = {
                "state": "done",
                "speed": cue.speed,
                "natural_s": round(cue.natural_s, 3),
                "duration_s": cue.result.duration_s,
                **stored_fields(cue.result.quality),  # the report's scores, as a server's dub has them
            }
    write_atomic(parts / f"cue{position:04d}.json", json.dumps(note).encode())


def cue_reader(parts: Path, position: int, note: dict[str, Any]) -> Any:
    if note.get("state") != "done":
        return lambda: None
    return lambda: sf.read(parts / f"cue{position:04d}.wav", dtype="float32")[0]


def cue_record(position: int, item: Any, note: dict[str, Any]) -> Any:
    """A cue made here as the item record the report is written from."""
    from cosyserve.service.stores.batches import BatchItem

    return BatchItem(
        batch_id="local",
        position=position,
        name=item.name,
        params=item.params,
        state=note.get("state") or "failed",
        error_code=None,
        error_message=note.get("error") or item.problem,
        output_id=None,
        duration_s=note.get("duration_s"),
        seed=None,
        attempt=None,
        run_s=None,
        result={key: note[key] for key in ("speed", "natural_s", "quality") if key in note},
        finished_at=None,
    )
