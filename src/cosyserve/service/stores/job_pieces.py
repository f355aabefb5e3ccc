"""The finished pieces of a long-text job, kept on disk while the job runs: an attempt that a restart, a
crash or an engine restart interrupts leaves them behind, and the next attempt goes on from the first
piece missing instead of making (and charging) the whole text again.

One folder per job under the output directory (`<output dir>/.job-pieces/<job id>/`), one pair of files
per piece: its audio (`<n>.npy`, float32, so the resumed result is the one an uninterrupted run makes) and
what describes it (`<n>.json`, written last: a piece without it was not finished). A piece counts only if
it was made for the same text by the same model; anything else starts the job over from that piece. The
folder goes when the job's record ends.
"""

from __future__ import annotations

import io
import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cosyserve.service.outcomes import SentenceTiming, SynthesisResult
from cosyserve.service.quality.takes import TakeReport
from cosyserve.service.stores.atomic_files import write_atomic
from cosyserve.service.stores.job_table import is_job_id

log = logging.getLogger(__name__)

FOLDER = ".job-pieces"  # hidden: the output store lists `output_*` files of its root only
FORMAT = 1


@dataclass(frozen=True)
class KeptPiece:
    """A piece an earlier attempt finished, and the audio seconds its key was charged for it."""

    result: SynthesisResult
    charged_s: float


class JobPieces:
    """Pieces of running long-text jobs, by job id and piece number. Failures to write are logged, never
    raised: a piece not kept is made again if the job is interrupted, nothing worse."""

    def __init__(self, output_root: Path) -> None:
        self.root = Path(output_root) / FOLDER

    def save(
        self,
        job_id: str,
        index: int,
        text: str,
        model: str,
        result: SynthesisResult,
        charged_s: float,
        attempt: int = 0,
    ) -> None:
        folder = self._folder(job_id)
        if folder is None or (index > 0 and not folder.is_dir()):  # dropped: its job ended meanwhile
            return
        audio = io.BytesIO()
        np.save(audio, np.ascontiguousarray(result.audio, dtype=np.float32), allow_pickle=False)
        described = {
            "format": FORMAT,
            "text": text,
            "model": model,
            "sample_rate": result.sample_rate,
            "seed": result.seed,
            "timings": [[t.text, t.start_s, t.end_s] for t in result.timings],
            "speech_tokens": result.speech_tokens,
            "stage_seconds": result.stage_seconds,
            "warnings": result.warnings,
            "reading": result.reading,
            "quality": result.quality.as_dict() if result.quality is not None else None,
            "charged_s": charged_s,
            "attempt": attempt,  # the attempt that made it: one that made pieces was no crash loop
        }
        try:
            write_atomic(folder / f"{index}.npy", audio.getvalue())
            write_atomic(folder / f"{index}.json", json.dumps(described, ensure_ascii=False).encode())
        except (OSError, TypeError, ValueError) as exc:
            log.warning("job %s: piece %d could not be kept for a resumed attempt: %s", job_id, index, exc)

    def kept(self, job_id: str, pieces: list[str], model: str) -> list[KeptPiece]:
        """The job's pieces finished by earlier attempts, in order from the first, up to the first one
        missing, unreadable, or made for another text or by another model (those after it are dropped)."""
        folder = self._folder(job_id)
        found: list[KeptPiece] = []
        if folder is None or not folder.is_dir():
            return found
        for index, text in enumerate(pieces):
            piece = self._read(folder, index, text, model)
            if piece is None or (found and piece.result.seed != found[0].result.seed):
                break  # (another seed: an attempt that started over while a stale one still wrote)
            found.append(piece)
        for stale in folder.glob("*"):  # what does not continue the kept run is made again
            number = stale.stem.split(".")[0]
            if not number.isdigit() or int(number) >= len(found):
                stale.unlink(missing_ok=True)
        return found

    def made_in(self, job_id: str, attempt: int) -> bool:
        """Whether attempt `attempt` of the job finished a piece (it progressed before it was stopped)."""
        folder = self._folder(job_id)
        if folder is None or not folder.is_dir():
            return False
        for described in folder.glob("*.json"):
            try:
                if json.loads(described.read_text(encoding="utf-8")).get("attempt") == attempt:
                    return True
            except (OSError, ValueError, AttributeError):
                continue
        return False

    def drop(self, job_id: str) -> None:
        folder = self._folder(job_id)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def sweep(self, is_active: Callable[[str], bool]) -> int:
        """Remove the folders of jobs that no longer run (ended while this server was down, purged);
        returns how many."""
        if not self.root.is_dir():
            return 0
        removed = 0
        for folder in self.root.iterdir():
            if not is_active(folder.name):
                shutil.rmtree(folder, ignore_errors=True)
                removed += 1
        return removed

    def _folder(self, job_id: str) -> Path | None:
        return self.root / job_id if is_job_id(job_id) else None

    @staticmethod
    def _read(folder: Path, index: int, text: str, model: str) -> KeptPiece | None:
        try:
            described: dict[str, Any] = json.loads((folder / f"{index}.json").read_text(encoding="utf-8"))
            made_for = (described.get("format"), described.get("text"), described.get("model"))
            if made_for != (FORMAT, text, model):
                return None
            audio = np.load(folder / f"{index}.npy", allow_pickle=False)
            quality = described.get("quality")
            result = SynthesisResult(
                audio=np.asarray(audio, dtype=np.float32),
                sample_rate=int(described["sample_rate"]),
                seed=int(described["seed"]),
                timings=[
                    SentenceTiming(n, str(t), float(start), float(end))
                    for n, (t, start, end) in enumerate(described["timings"])
                ],
                speech_tokens=int(described.get("speech_tokens") or 0),
                stage_seconds={str(k): float(v) for k, v in (described.get("stage_seconds") or {}).items()},
                warnings=[str(w) for w in described.get("warnings") or []],
                reading=dict(described.get("reading") or {}),
                quality=TakeReport.from_dict(quality) if isinstance(quality, dict) else None,
            )
            return KeptPiece(result, float(described.get("charged_s") or 0.0))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("a kept piece in %s is unreadable and is made again: %s", folder, exc)
            return None
