"""Long-text jobs on the local backend: a text too long for one request is synthesised piece by piece,
its progress and its end written to the job's record.

The record follows the ticket (`job_state.JobStateRecorder` is the ticket's `on_state`): the work claims
the job as a numbered attempt when it starts (`JobStore.claim`), then the record ends done with the
stored output, failed, or cancelled. Whatever an attempt writes lands only while it is the job's current
one (another worker may have taken it over), and an output made by an attempt that lost the job is deleted
again. A shutdown leaves the jobs of a server that owns its job table in the queue for its next start.

Each segment gets its own timeout (`job_segment_timeout_s`), so a job's limit grows with its length and
does not depend on the interactive request timeout; each segment's audio is charged to the key's quota as
it is made, and the job stops with `quota_exceeded`, keeping what it finished, once the quota is used up.
Before each segment is charged its key is checked again (`KeyWatch`): a revoked key's job stops there with
`key_revoked`, and that segment is not charged. A job stopped midway (quota, key, a client's cancel, an
error) keeps its finished segments as a partial result, and its record says which part is missing.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cosyserve.errors import (
    Cancelled,
    CosyServeError,
    ModelNotReady,
    ShuttingDown,
)
from cosyserve.service.access.key_watch import KeyChanged, KeyRevoked, KeyWatch
from cosyserve.service.local.job_quota import JobQuota
from cosyserve.service.local.synthesis_stream import SynthesisStream
from cosyserve.service.local.synthesizer import Synthesizer
from cosyserve.service.local.voice_pins import PinnedVoice
from cosyserve.service.outcomes import SentenceTiming, SynthesisProgress, SynthesisResult, TtsOutcome
from cosyserve.service.quality.reporting import combined_report
from cosyserve.service.requests import EVERY_VOICE, SynthesisRequest, VoiceScope
from cosyserve.service.scheduling.tickets import WorkContext
from cosyserve.service.stores.job_pieces import KeptPiece
from cosyserve.service.stores.jobs import JobStore

log = logging.getLogger(__name__)

PROGRESS_WRITE_S = 0.5  # job progress goes to the database at most this often
CLIENT_CANCEL = "cancelled by the client"  # the cancel reason after which a job keeps its finished part


@dataclass(frozen=True)
class JobResult:
    """What a job's work returns: the stored result (None: a batch, whose items are its result), what the
    record keeps besides, and why it stopped early (its finished part kept)."""

    outcome: TtsOutcome | None
    extra: dict[str, Any] = field(default_factory=dict)
    stopped: CosyServeError | None = None

    @property
    def duration_s(self) -> float:
        """Seconds of audio it made (what the activity log reports)."""
        return (
            self.outcome.duration_s if self.outcome is not None else float(self.extra.get("audio_s") or 0.0)
        )

    @property
    def output_id(self) -> str | None:
        return self.outcome.output_id if self.outcome is not None else None


@dataclass(frozen=True)
class JobRun:
    """One attempt at one job, as the work that runs it sees it."""

    job_id: str
    attempt: int
    key_id: int | None  # the key charged for its audio
    jobs: JobStore
    quota: JobQuota
    segment_timeout_s: float

    def arm(self, ctx: WorkContext, what: str = "a segment of the job") -> None:
        """Start the clock of the next segment (or item)."""
        ctx.set_timeout(
            self.segment_timeout_s,
            f"{what} ran longer than {self.segment_timeout_s:g} s (job_segment_timeout_s) and was stopped: "
            "the server may be overloaded; retry the job, or raise job_segment_timeout_s",
        )

    def check_key(self, voices: Iterable[Any] = (), *, stage: str = "segment") -> None:
        """KeyRevoked / KeyChanged when the job's key may no longer go on with `voices` (one query; none
        without a key); `stage`: see `KeyWatch.check`."""
        KeyWatch(self.quota.key_lookup, self.key_id).check(voices, stage=stage)


class QuotaStop(Exception):
    """Raised between segments when the key's quota ran out: the job keeps what it finished."""


@dataclass(frozen=True)
class PiecesMade:
    """What `run_pieces` made: the audio of its finished segments, and why it stopped early (None: it
    did not)."""

    result: SynthesisResult
    stopped: CosyServeError | None
    segments_done: int
    segments_total: int

    def partial(self) -> dict[str, Any]:
        """What a record says of a job that stopped early: how far it got and what is missing."""
        return {
            "segments_done": self.segments_done,
            "segments_total": self.segments_total,
            "missing_from": self.segments_done,  # segments run in order: this one and every later one
            "audio_s": round(self.result.duration_s, 3),
        }


def stop_reason(exc: BaseException, ctx: WorkContext, run: JobRun) -> CosyServeError | None:
    """Why the work stopped early while keeping what it finished, or None when it must fail as a whole
    (a shutdown leaves the job for the next start; a timeout or a lost job has ended it already)."""
    if isinstance(exc, QuotaStop):
        return run.quota.exceeded(run.key_id)
    if isinstance(exc, Cancelled):
        try:
            ctx.check_cancelled()  # raises with the reason the ticket was cancelled for
        except Cancelled as why:
            return why if str(why) == CLIENT_CANCEL else None
        return None
    if isinstance(exc, ShuttingDown | ModelNotReady) or ctx.cancel.is_set():
        return None
    return exc if isinstance(exc, CosyServeError) else None


def run_pieces(
    ctx: WorkContext,
    synth: Synthesizer,
    request: SynthesisRequest,
    pieces: list[str],
    run: JobRun,
    voices: VoiceScope = EVERY_VOICE,
    pinned: PinnedVoice | None = None,
    kept: Sequence[KeptPiece] = (),
    keep: Callable[[int, SynthesisResult, float], object] | None = None,
) -> PiecesMade:
    """Synthesise the pieces in order with one seed, reporting progress on the ticket and the record,
    checking the key and charging each segment; stops early (keeping its whole segments) at the quota, a
    revoked key, a client's cancel or an error. A saved voice outside `voices` is not found; `pinned`: the
    voice as the job pinned it. `kept`: the first pieces, finished by an earlier attempt (the rest go on
    with their seed); `keep(index, result, charged_s)` is told of each piece finished."""
    voices = [pinned.voice] if pinned is not None else []
    if not kept:  # revoked while it waited in the queue: nothing was made (with kept pieces: below)
        run.check_key(voices, stage="start")
    if not run.quota.allows_id(run.key_id, run.job_id):  # used up, or lowered below its usage, as it waited
        raise run.quota.exceeded(run.key_id, started=False)
    run.arm(ctx)  # checking every piece is part of the first segment's time
    last_write = [0.0]
    charged_by_piece = [0.0] * len(pieces)

    def progress_of(index: int) -> Callable[[SynthesisProgress], None]:
        charged = 0.0

        def progress(p: SynthesisProgress) -> None:
            nonlocal charged
            fraction = (index + p.fraction) / len(pieces)
            ctx.set_progress(fraction)
            run.arm(ctx)  # the next segment's clock
            if p.kept and p.audio_seconds > charged:  # of several takes, only the kept one
                run.check_key(voices)  # before charging: a segment made after a revoke is never charged
                allowed = run.quota.charge(run.key_id, run.job_id, p.audio_seconds - charged)
                charged = charged_by_piece[index] = p.audio_seconds
                if not allowed and fraction < 1.0:
                    raise QuotaStop
            if time.monotonic() - last_write[0] >= PROGRESS_WRITE_S:
                last_write[0] = time.monotonic()
                run.jobs.set_progress(run.job_id, fraction, attempt=run.attempt)
            if p.segments_done > 0 and not p.chosen:
                ctx.next_unit()  # each segment is a unit: other work may have the engine in between

        return progress

    # Every piece is checked before any audio is made; later pieces reuse the first one's seed (one seed
    # reproduces the job).
    streams = []
    seed = kept[0].result.seed if kept else request.seed
    for index in range(len(kept), len(pieces)):
        part = dataclasses.replace(request, text=pieces[index], seed=seed)
        stream = synth.synthesize(
            part, progress=progress_of(index), cancel=ctx.cancel, voices=voices, pinned=pinned
        )
        seed = stream.seed
        streams.append((index, stream))
    results: list[SynthesisResult] = [piece.result for piece in kept]
    total = sum(len(r.timings) for r in results) + sum(stream.segment_count for _, stream in streams)
    if results:
        if (revoked := _kept_if_revoked(run, voices, results, total)) is not None:
            return revoked
        ctx.set_progress(len(results) / len(pieces))
        ctx.share_partial(tuple(results))
    for index, stream in streams:
        run.arm(ctx)
        chunks: list[np.ndarray] = []
        try:
            ctx.check_cancelled()
            chunks.extend(chunk.samples for chunk in stream)
            result = stream.result()
        except Exception as exc:
            return _stopped_early(exc, ctx, run, stream, synth.sample_rate, chunks, results, total)
        results.append(result)
        if keep is not None and not ctx.cancel.is_set():  # an attempt that lost its job keeps nothing
            keep(index, result, charged_by_piece[index])
        ctx.share_partial(tuple(results))  # the studio plays the finished pieces while the rest is made
    return PiecesMade(merge_results(results), None, total, total)


def _kept_if_revoked(
    run: JobRun, voices: list[Any], results: list[SynthesisResult], total: int
) -> PiecesMade | None:
    """Revoked while it waited after a restart: the pieces an earlier attempt made are its result."""
    try:
        run.check_key(voices)
    except (KeyRevoked, KeyChanged) as exc:
        return PiecesMade(merge_results(results), exc, sum(len(r.timings) for r in results), total)
    return None


def _stopped_early(
    exc: Exception,
    ctx: WorkContext,
    run: JobRun,
    stream: SynthesisStream,
    rate: int,
    chunks: list[np.ndarray],
    results: list[SynthesisResult],
    total: int,
) -> PiecesMade:
    """What a job keeps when `exc` stopped it in `stream`'s piece: the pieces before it and that piece's
    whole segments; raises `exc` again when it must fail as a whole, or kept nothing."""
    stopped = stop_reason(exc, ctx, run)
    if stopped is None:
        raise exc
    finished = stream.timings
    if isinstance(exc, KeyRevoked | KeyChanged):  # its last segment was not charged: not kept either
        finished = finished[:-1]
    whole = _whole_segments(stream.seed, rate, chunks, finished)
    results = results + ([whole] if whole is not None else [])
    if not results and isinstance(exc, QuotaStop):
        raise stopped from None
    if not results:
        raise exc
    done = sum(len(r.timings) for r in results)
    return PiecesMade(merge_results(results), stopped, done, total)


def _whole_segments(
    seed: int, rate: int, chunks: list[np.ndarray], timings: list[SentenceTiming]
) -> SynthesisResult | None:
    """The audio of the segments that finished (a segment cut off midway is dropped), or None."""
    if not timings or not chunks:
        return None
    audio = np.concatenate(chunks)[: round(timings[-1].end_s * rate)]
    return SynthesisResult(audio=audio, sample_rate=rate, seed=seed, timings=list(timings))


def merge_results(results: list[SynthesisResult]) -> SynthesisResult:
    """Pieces of one job as one result: audio concatenated, timings shifted, stage seconds summed."""
    if len(results) == 1:
        return results[0]
    rate = results[0].sample_rate
    timings: list[SentenceTiming] = []
    stages: dict[str, float] = {}
    offset = 0.0
    for result in results:
        for timing in result.timings:
            timings.append(
                SentenceTiming(len(timings), timing.text, timing.start_s + offset, timing.end_s + offset)
            )
        offset += result.duration_s
        for stage, seconds in result.stage_seconds.items():
            stages[stage] = stages.get(stage, 0.0) + seconds
    return SynthesisResult(
        audio=np.concatenate([r.audio for r in results]),
        sample_rate=rate,
        seed=results[0].seed,
        timings=timings,
        speech_tokens=sum(r.speech_tokens for r in results),
        stage_seconds=stages,
        warnings=[w for r in results for w in r.warnings],
        quality=combined_report([r.quality for r in results]),
    )
