"""The local backend: what the service runs on its own scheduler and model (a single server, a worker).

One-shot and streamed syntheses, long-text jobs (`local.jobs`) and voice enrolment, each as work for the
scheduler that borrows the synthesizer from the `ModelHost`. Every finished synthesis is stored (WAV at
the model's rate, plus its provenance manifest) and counted (audio seconds, real-time factor, the caller's
quota); formats other than WAV are encoded from it for the response, downloads can transcode later. A
streamed ticket yields a `StreamStart` first (the request was checked and the seed is known: the response
can begin), then encoded bytes as they are ready.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from cosyserve.service.access.limits import QuotaTracker
from cosyserve.service.audio_formats import StreamEncoder, encode, mime_type
from cosyserve.service.backend import AudioStream, cancellable_job, job_pieces, new_job_id
from cosyserve.service.local.jobs import JobStateRecorder, run_pieces
from cosyserve.service.local.model_host import ModelHost
from cosyserve.service.local.synthesizer import Synthesizer
from cosyserve.service.logs import log_failure, request_context
from cosyserve.service.metrics import Metrics
from cosyserve.service.requests import (
    EnrolmentRequest,
    OutputSpec,
    StreamStart,
    SynthesisProgress,
    SynthesisRequest,
    SynthesisResult,
    TtsOutcome,
    job_parameters,
)
from cosyserve.service.scheduling.scheduler import Scheduler, Ticket, WorkContext
from cosyserve.service.setting_groups import LimitSettings
from cosyserve.service.startup_clock import StartupClock
from cosyserve.service.stores.jobs import JobRecord, JobStore
from cosyserve.service.stores.outputs import OutputStore, build_manifest
from cosyserve.service.stores.voices import Voice

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class LocalBackend:
    """Synthesis in this process: the model its host holds, run on its scheduler, results kept in the
    stores and counted."""

    host: ModelHost
    scheduler: Scheduler
    jobs: JobStore
    outputs: OutputStore
    quota: QuotaTracker  # charged for the audio each key's requests produce
    metrics: Metrics
    limits: LimitSettings
    startup: StartupClock
    recover_jobs: bool  # this process alone owns the job table: an earlier process's leftovers end failed
    upload_outputs: bool  # outputs go to the bucket before the answer (a worker's API node reads them there)

    # -- lifecycle and readiness ---------------------------------------------------------------------------

    @property
    def model_info(self) -> dict[str, Any]:
        return self.host.info

    def start(self) -> None:
        if self.recover_jobs:
            recovered = self.jobs.recover_interrupted()
            if recovered:
                log.warning(
                    "%d jobs left queued or running by an earlier process were marked failed", recovered
                )
        self.host.start()

    def stop(self) -> None:
        self.host.stop()

    def readiness(self, detailed: bool, *, accepting: bool) -> dict[str, Any]:
        return self.host.readiness(detailed, accepting=accepting)

    def require_ready(self) -> None:
        self.host.require_ready()

    def restart_engine(self) -> str:
        return self.host.restart()

    # -- synthesis -----------------------------------------------------------------------------------------

    def submit_tts(self, request: SynthesisRequest, spec: OutputSpec) -> Ticket:
        """Queue one synthesis (QueueFull, ShuttingDown, ModelNotReady, InputError for bad formats)."""
        self.require_ready()
        spec = spec.checked(self.model_info.get("sample_rate"))

        def work(ctx: WorkContext) -> TtsOutcome:
            with request_context(spec.request_id), self.host.synthesizer(ctx.cancel) as synth:
                result = self._run_engine(
                    lambda: synth.synthesize(
                        request, progress=_progress_to(ctx), cancel=ctx.cancel, voices=spec.voice_scope
                    ).result()
                )
                return self._finish(synth, request, result, spec, encoded=True)

        return self.scheduler.submit(work, owner=spec.owner)

    def stream_tts(self, request: SynthesisRequest, spec: OutputSpec) -> AudioStream:
        """Queue one synthesis whose encoded audio is read while the engine makes it."""
        self.require_ready()
        spec = spec.checked(self.model_info.get("sample_rate"))
        request = dataclasses.replace(request, stream=True)

        def work(ctx: WorkContext) -> Generator[StreamStart | bytes, None, TtsOutcome]:
            return self._stream_items(ctx, request, spec)

        return AudioStream(self.scheduler.submit(work, owner=spec.owner, stream=True))

    def _stream_items(
        self, ctx: WorkContext, request: SynthesisRequest, spec: OutputSpec
    ) -> Generator[StreamStart | bytes, None, TtsOutcome]:
        """What `AudioStream` reads: the start, then encoded chunks; returns the outcome."""
        with request_context(spec.request_id), self.host.synthesizer(ctx.cancel) as synth:
            stream = self._run_engine(
                lambda: synth.synthesize(
                    request, progress=_progress_to(ctx), cancel=ctx.cancel, voices=spec.voice_scope
                )
            )
            encoder = StreamEncoder(spec.format, spec.sample_rate, source_rate=synth.sample_rate)
            yield StreamStart(stream.seed, encoder.media_type, encoder.sample_rate)
            head = encoder.header()
            if head:
                yield head
            chunks = iter(stream)
            first = True
            while True:
                chunk = self._run_engine(lambda: next(chunks, None))
                if chunk is None:
                    break
                if first and stream.first_audio_at is not None:
                    first = False
                    self.metrics.observe_first_chunk(stream.first_audio_at - ctx.submitted_at)
                data = encoder.encode(chunk.samples)
                if data:
                    yield data
            tail = encoder.finish()
            if tail:
                yield tail
            return self._finish(synth, request, stream.result(), spec, encoded=False)

    def _run_engine(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except BaseException as exc:
            self.host.note_result(exc)
            raise

    def _finish(
        self,
        synth: Synthesizer,
        request: SynthesisRequest,
        result: SynthesisResult,
        spec: OutputSpec,
        *,
        encoded: bool,
    ) -> TtsOutcome:
        """Store the result with its manifest, count it, and encode the response if asked."""
        self.host.note_result(None)
        rate = result.sample_rate
        wav = encode(result.audio, "wav", source_rate=rate)
        audio = None
        if encoded:
            same = spec.format == "wav" and spec.sample_rate == rate
            audio = (
                wav
                if same
                else encode(result.audio, spec.format, source_rate=rate, sample_rate=spec.sample_rate)
            )
        parameters = {
            "endpoint": spec.endpoint,
            "response_format": spec.format,
            "response_sample_rate": spec.sample_rate,
            "request_id": spec.request_id,
            **spec.extra,
        }
        manifest = build_manifest(
            request,
            result,
            format="wav",
            sample_rate=rate,
            model_checksum=synth.model_dir.fingerprint,
            owner=spec.owner,
            parameters=parameters,
        )
        stored, storage_error = None, None
        try:
            stored = self.outputs.save(wav, "wav", manifest, upload_now=self.upload_outputs)
        except Exception as exc:  # a waiting caller still gets its audio, marked unsaved; jobs fail
            storage_error = str(exc) or type(exc).__name__
            log_failure("storage_error", f"saving the output failed: {exc}", exc=exc)
            self.metrics.count_error("storage_error")
        self.metrics.observe_synthesis(result.duration_s, result.stage_seconds.get("total", 0.0))
        self.startup.first_synthesis(result.stage_seconds.get("total", 0.0), result.duration_s)
        if spec.key is not None:
            self.quota.add(spec.key, result.duration_s)
        return TtsOutcome(
            seed=result.seed,
            duration_s=result.duration_s,
            speech_tokens=result.speech_tokens,
            output_id=stored.id if stored else None,
            output_path=str(stored.path) if stored else None,
            media_type=mime_type(spec.format),
            warnings=tuple(result.warnings),
            audio=audio,
            storage_error=storage_error,
        )

    # -- jobs ----------------------------------------------------------------------------------------------

    def submit_job(self, request: SynthesisRequest, spec: OutputSpec) -> JobRecord:
        """Accept a (possibly long) text as a job; its record always ends done, failed or cancelled."""
        self.require_ready()
        spec = spec.checked(self.model_info.get("sample_rate"))
        job_pieces(request, self.limits.max_text_chars)  # fails early on a text that is too long
        job_id = new_job_id()
        recorded = threading.Event()
        ticket = self._submit_job_work(job_id, request, spec, attempt=None, recorded=recorded)
        try:
            params = job_parameters(request, spec)
            record = self.jobs.create(params, kind="tts", owner=spec.owner, job_id=job_id)
        except BaseException:
            recorded.set()  # before cancelling: on_state waits for it
            ticket.cancel("the job record could not be written")
            raise
        recorded.set()
        return record

    def run_claimed_job(
        self, job_id: str, attempt: int, request: SynthesisRequest, spec: OutputSpec
    ) -> Ticket:
        """Run a job this worker claimed (`JobStore.claim`) as `attempt`; its results land only while that
        attempt is still the job's current one."""
        done = threading.Event()
        done.set()
        return self._submit_job_work(job_id, request, spec, attempt=attempt, recorded=done)

    def _submit_job_work(
        self,
        job_id: str,
        request: SynthesisRequest,
        spec: OutputSpec,
        *,
        attempt: int | None,
        recorded: threading.Event,
    ) -> Ticket:
        pieces = job_pieces(request, self.limits.max_text_chars)
        on_state = JobStateRecorder(self.jobs, self.outputs, job_id, attempt, recorded, spec, len(pieces))

        def work(ctx: WorkContext) -> TtsOutcome:
            with request_context(spec.request_id), self.host.synthesizer(ctx.cancel) as synth:
                result = self._run_engine(
                    lambda: run_pieces(
                        ctx, synth, request, pieces, self.jobs, job_id, attempt, voices=spec.voice_scope
                    )
                )
                ctx.check_cancelled()  # lost the job while finishing the last piece: no output
                return self._finish(synth, request, result, spec, encoded=False)

        return self.scheduler.submit(work, job_id=job_id, owner=spec.owner, on_state=on_state)

    def cancel_job(self, job_id: str) -> JobRecord:
        """Cancel a queued or running job (JobStateError if it already ended)."""
        record = cancellable_job(self.jobs, job_id)
        if not self.scheduler.cancel(job_id, "cancelled by the client"):
            # Not in this process's scheduler (an earlier process's record): end the record itself.
            return self.jobs.finish_cancelled(job_id, "cancelled by the client")
        return self.jobs.get(job_id) or record

    # -- voices --------------------------------------------------------------------------------------------

    def submit_enrolment(self, enrolment: EnrolmentRequest, *, request_id: str | None = None) -> Ticket:
        """Analyse and store a new voice (the prompt models run on the accelerator too)."""
        self.require_ready()
        e = enrolment

        def work(ctx: WorkContext) -> Voice:
            with request_context(request_id), self.host.synthesizer(ctx.cancel) as synth:
                return synth.add_voice(
                    e.name,
                    e.audio,
                    e.transcript,
                    audio_suffix=e.suffix,
                    defaults=e.defaults,
                    lexicon=e.lexicon,
                    owner=e.owner,
                )

        return self.scheduler.submit(work)


def _progress_to(ctx: WorkContext) -> Callable[[SynthesisProgress], None]:
    """Report a synthesis' sentence progress on its ticket (the UI's progress bar, job polling)."""
    return lambda progress: ctx.set_progress(progress.fraction)
