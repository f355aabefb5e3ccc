"""What an attempt at a long-text job takes over from the earlier ones a crash or a restart interrupted:
the output one saved before it could record it (nothing is made twice), or the pieces they finished
(the attempt goes on from the first one missing; what the rest of their audio was charged goes back)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from cosyserve.service.local.long_text_jobs import JobRun
from cosyserve.service.outcomes import SynthesisResult, TtsOutcome
from cosyserve.service.quality.reporting import saved_report
from cosyserve.service.stores.job_pieces import JobPieces, KeptPiece
from cosyserve.service.stores.outputs import OutputStore

log = logging.getLogger(__name__)

ORPHAN_SCAN = 200  # recent outputs looked through for a result an interrupted attempt saved

Keep = Callable[[int, SynthesisResult, float], object]  # (piece index, its result, seconds charged)


def saved_result(outputs: OutputStore, job_id: str, owner: str | None) -> TtsOutcome | None:
    """The output an interrupted attempt of this job saved before it could record it, if any."""
    for output in outputs.list(owner=owner, limit=ORPHAN_SCAN):
        if (output.manifest.get("parameters") or {}).get("job_id") == job_id:
            manifest = output.manifest
            return TtsOutcome(
                seed=int(manifest.get("seed") or 0),
                duration_s=float(manifest.get("duration_s") or 0.0),
                speech_tokens=int(manifest.get("speech_tokens") or 0),
                output_id=output.id,
                output_path=str(output.path),
                media_type="audio/wav",
                warnings=tuple(manifest.get("warnings") or ()),
                quality=saved_report(manifest),  # the job's scores, as its status showed them
            )
    return None


def made_with(info: dict[str, Any]) -> str:
    """What a piece's audio depends on besides its text and seed: the model's weights and how the engine
    runs them (a piece made otherwise is made again, not spliced in)."""
    return "|".join(str(info.get(key)) for key in SIGNATURE)


SIGNATURE = ("fingerprint", "device", "preset", "precision", "flow_steps", "flow_guidance")


def resumed_pieces(
    store: JobPieces | None, job_id: str, pieces: list[str], model: str, run: JobRun
) -> tuple[list[KeptPiece], Keep | None]:
    """The pieces earlier attempts finished with `model`, which this attempt goes on after (taking back
    what the rest of their audio was charged), and how this attempt keeps its own."""
    if store is None:  # no store: an attempt after the first starts over
        if run.attempt > 1:
            run.quota.refund_discarded(run.key_id, job_id)
        return [], None
    kept = store.kept(job_id, pieces, model) if run.attempt > 1 else []
    if run.attempt > 1:
        refunded = run.quota.refund_discarded(run.key_id, job_id, keep_s=sum(p.charged_s for p in kept))
        log.info(
            "job %s (attempt %d) goes on from piece %d of %d; %.1f s of audio its earlier attempts made "
            "are discarded and no longer charged",
            job_id,
            run.attempt,
            len(kept) + 1,
            len(pieces),
            refunded,
        )

    def keep(index: int, result: SynthesisResult, charged_s: float) -> None:
        store.save(job_id, index, pieces[index], model, result, charged_s, run.attempt)

    return kept, keep
