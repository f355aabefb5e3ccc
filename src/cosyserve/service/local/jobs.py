"""Long-text jobs on the local backend: a text too long for one request is synthesised piece by piece,
its progress and its end written to the job's record.

The record follows the ticket (`JobStateRecorder` is the ticket's `on_state`): running, then done with the
stored output, failed or cancelled. A worker runs a job as a numbered attempt; whatever it writes lands
only while that attempt is the job's current one (another worker may have taken it over), and an output
made by an attempt that lost the job is deleted again.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import numpy as np

from cosyserve.errors import Cancelled, JobStateError
from cosyserve.service.local.synthesizer import Synthesizer
from cosyserve.service.requests import (
    EVERY_VOICE,
    OutputSpec,
    SentenceTiming,
    SynthesisProgress,
    SynthesisRequest,
    SynthesisResult,
    TtsOutcome,
    VoiceScope,
)
from cosyserve.service.scheduling.tickets import Ticket, WorkContext
from cosyserve.service.stores.jobs import JobStore
from cosyserve.service.stores.outputs import OutputStore

log = logging.getLogger(__name__)

PROGRESS_WRITE_S = 0.5  # job progress goes to the database at most this often
RECORD_WAIT_S = 30.0  # how long a state change waits for the job's record to be written


class JobStateRecorder:
    """A job ticket's `on_state`: moves the job's record along with the ticket."""

    def __init__(
        self,
        jobs: JobStore,
        outputs: OutputStore,
        job_id: str,
        attempt: int | None,
        recorded: threading.Event,
        spec: OutputSpec,
        pieces: int,
    ) -> None:
        self.jobs, self.outputs = jobs, outputs
        self.job_id, self.attempt = job_id, attempt  # attempt None: this process created the job
        self.recorded = recorded  # set once the record exists (it is written right after submit returns)
        self.spec, self.pieces = spec, pieces

    def __call__(self, ticket: Ticket, state: str) -> None:
        self.recorded.wait(RECORD_WAIT_S)
        try:
            if state == "running":
                if self.attempt is None:  # a claimed job is already running
                    self.jobs.mark_running(self.job_id)
            elif state == "done":
                self._done(ticket.value)
            else:
                error = ticket.error or Cancelled("cancelled")
                self.jobs.finish_with_exception(self.job_id, error, attempt=self.attempt)
        except JobStateError as exc:
            log.warning("job %s: %s", self.job_id, exc)

    def _done(self, outcome: TtsOutcome) -> None:
        extra = {"warnings": list(outcome.warnings), "format": self.spec.format, "pieces": self.pieces}
        try:
            self.jobs.finish_done(
                self.job_id,
                output_id=outcome.output_id,
                output_path=outcome.output_path,
                duration_s=outcome.duration_s,
                seed=outcome.seed,
                extra=extra,
                attempt=self.attempt,
            )
        except JobStateError:
            self._discard_output(outcome.output_id)  # another attempt owns the job's result
            raise

    def _discard_output(self, output_id: str | None) -> None:
        if output_id is None:
            return
        try:
            self.outputs.delete(output_id)
        except Exception as exc:  # nothing refers to it; retention removes it later anyway
            log.warning("could not delete the unused output %s: %s", output_id, exc)


def run_pieces(
    ctx: WorkContext,
    synth: Synthesizer,
    request: SynthesisRequest,
    pieces: list[str],
    jobs: JobStore,
    job_id: str,
    attempt: int | None = None,
    voices: VoiceScope = EVERY_VOICE,
) -> SynthesisResult:
    """Synthesise the pieces in order with one seed, reporting progress on the ticket and the record;
    a saved voice outside `voices` (the job's caller may not use it) is not found."""
    results: list[SynthesisResult] = []
    seed = request.seed
    last_write = 0.0
    for index, piece in enumerate(pieces):
        ctx.check_cancelled()

        def progress(p: SynthesisProgress, index: int = index) -> None:
            nonlocal last_write
            fraction = (index + p.fraction) / len(pieces)
            ctx.set_progress(fraction)
            if time.monotonic() - last_write >= PROGRESS_WRITE_S:
                last_write = time.monotonic()
                jobs.set_progress(job_id, fraction, attempt=attempt)

        part = dataclasses.replace(request, text=piece, seed=seed)
        result = synth.synthesize(part, progress=progress, cancel=ctx.cancel, voices=voices).result()
        seed = result.seed  # later pieces reuse the first piece's seed: one seed reproduces the job
        results.append(result)
    return merge_results(results)


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
    )
