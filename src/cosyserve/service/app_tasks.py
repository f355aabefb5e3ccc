"""What the service runs on its scheduler: one-shot and streamed syntheses, long-text jobs, voice enrolment.

Every finished synthesis is stored (WAV at the model's rate, plus its provenance manifest) and counted
(audio seconds, real-time factor, the caller's quota). Formats other than WAV are encoded from it for the
response; downloads can transcode later. A streamed ticket yields a `StreamStart` first (the request was
checked and the seed is known: the response can begin), then encoded bytes as they are ready.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from cosyserve.errors import Cancelled, InputError, JobStateError
from cosyserve.frontend.text.split import cut_after, has_content
from cosyserve.service.audio_formats import StreamEncoder, check_format, check_sample_rate, encode, mime_type
from cosyserve.service.auth import ApiKey
from cosyserve.service.jobs import JobRecord
from cosyserve.service.logs import log_failure, request_context
from cosyserve.service.requests import SentenceTiming, SynthesisProgress, SynthesisRequest, SynthesisResult
from cosyserve.service.scheduler import Ticket, WorkContext
from cosyserve.service.storage import build_manifest
from cosyserve.service.voices import Voice, VoiceDefaults

if TYPE_CHECKING:
    from cosyserve.service.app_state import Service

log = logging.getLogger(__name__)

JOB_TEXT_FACTOR = 50  # a job may carry this many times max_text_chars; it is synthesised piece by piece
SENTENCE_ENDS = frozenset("。？！；.?!;…\n")
COMMAS = frozenset("，,、：:")
PROGRESS_WRITE_S = 0.5  # job progress goes to the database at most this often


class JobNotFound(InputError):
    """No job with that id (never created, purged, or someone else's)."""


@dataclass(frozen=True)
class OutputSpec:
    """How a result is delivered and attributed."""

    format: str = "wav"
    sample_rate: int | None = None  # None: the model's rate
    owner: str | None = None
    key: ApiKey | None = None  # charged for the audio seconds produced
    request_id: str | None = None
    endpoint: str = "tts"
    extra: dict[str, Any] = field(default_factory=dict)  # recorded in the manifest's parameters

    def checked(self, source_rate: int | None = None) -> OutputSpec:
        fmt = check_format(self.format)
        rate = check_sample_rate(fmt, self.sample_rate, source_rate or 24000)
        return dataclasses.replace(self, format=fmt, sample_rate=rate)


@dataclass(frozen=True)
class StreamStart:
    """The first item of a streamed ticket."""

    seed: int
    media_type: str
    sample_rate: int


@dataclass(frozen=True)
class TtsOutcome:
    seed: int
    duration_s: float
    speech_tokens: int
    output_id: str | None
    output_path: str | None
    media_type: str
    warnings: tuple[str, ...] = ()
    audio: bytes | None = None  # the encoded response (not for streams)


class ServiceTasks:
    """Mixed into `Service`: submitting synthesis work and jobs."""

    def submit_tts(
        self: Service, request: SynthesisRequest, spec: OutputSpec, *, stream: bool = False
    ) -> Ticket:
        """Queue one synthesis (QueueFull, ShuttingDown, ModelNotReady, InputError for bad formats)."""
        self.require_ready()
        spec = spec.checked(self.model_info.get("sample_rate"))
        if stream:
            request = dataclasses.replace(request, stream=True)
        if self.remote is not None:  # an API node: a worker synthesises, this thread relays its output
            return self.scheduler.submit(
                self.remote.tts_work(request, spec, stream), owner=spec.owner, stream=stream
            )

        def work(ctx: WorkContext) -> Any:
            if stream:
                return self._stream_items(ctx, request, spec)
            with request_context(spec.request_id), self.synthesizer(ctx.cancel) as synth:
                result = self._run_engine(
                    lambda: synth.synthesize(request, progress=_progress_to(ctx), cancel=ctx.cancel).result()
                )
                return self._finish(synth, request, result, spec, encoded=True)

        return self.scheduler.submit(work, owner=spec.owner, stream=stream)

    def _stream_items(
        self: Service, ctx: WorkContext, request: SynthesisRequest, spec: OutputSpec
    ) -> Iterator[Any]:
        with request_context(spec.request_id), self.synthesizer(ctx.cancel) as synth:
            stream = self._run_engine(
                lambda: synth.synthesize(request, progress=_progress_to(ctx), cancel=ctx.cancel)
            )
            encoder = StreamEncoder(spec.format, spec.sample_rate, source_rate=synth.sample_rate)
            yield StreamStart(stream.seed, encoder.media_type, encoder.sample_rate)
            head = encoder.header()
            if head:
                yield head
            chunks = iter(stream)
            while True:
                chunk = self._run_engine(lambda: next(chunks, None))
                if chunk is None:
                    break
                data = encoder.encode(chunk.samples)
                if data:
                    yield data
            tail = encoder.finish()
            if tail:
                yield tail
            return self._finish(synth, request, stream.result(), spec, encoded=False)

    def _run_engine(self: Service, call: Any) -> Any:
        try:
            return call()
        except BaseException as exc:
            self.note_engine_result(exc)
            raise

    def _finish(
        self: Service,
        synth: Any,
        request: SynthesisRequest,
        result: SynthesisResult,
        spec: OutputSpec,
        *,
        encoded: bool,
    ) -> TtsOutcome:
        """Store the result with its manifest, count it, and encode the response if asked."""
        self.note_engine_result(None)
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
        stored = None
        try:
            # A worker uploads before answering: the API node that serves the result reads the bucket.
            upload_now = self.role == "worker" and self.s3 is not None
            stored = self.outputs.save(wav, "wav", manifest, upload_now=upload_now)
        except Exception as exc:  # the caller still gets its audio; the failure is logged and counted
            log_failure("storage", f"saving the output failed: {exc}", exc=exc)
            self.metrics.count_error("storage")
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
        )

    # -- jobs ---------------------------------------------------------------------------------------------

    def submit_job(self: Service, request: SynthesisRequest, spec: OutputSpec) -> JobRecord:
        """Accept a (possibly long) text as a job; its record always ends done, failed or cancelled."""
        self.require_ready()
        spec = spec.checked(self.model_info.get("sample_rate"))
        limit = self.settings.limits.max_text_chars * JOB_TEXT_FACTOR
        if len(request.text) > limit:
            raise InputError(f"a job text may have at most {limit} characters, got {len(request.text)}")
        split_for_job(request.text, self.settings.limits.max_text_chars)  # fails early on unusable text
        job_id = _new_id()
        if self.remote is not None:
            return self.remote.submit_job(job_id, request, spec)
        recorded = threading.Event()
        ticket = self._submit_job_work(job_id, request, spec, attempt=None, recorded=recorded)
        try:
            record = self.jobs.create(_job_params(request, spec), kind="tts", owner=spec.owner, job_id=job_id)
        except BaseException:
            recorded.set()  # before cancelling: on_state waits for it
            ticket.cancel("the job record could not be written")
            raise
        recorded.set()
        return record

    def run_claimed_job(
        self: Service, job_id: str, attempt: int, request: SynthesisRequest, spec: OutputSpec
    ) -> Ticket:
        """Run a job this worker claimed (`JobStore.claim`) as `attempt`; its results land only while that
        attempt is still the job's current one."""
        done = threading.Event()
        done.set()
        return self._submit_job_work(job_id, request, spec, attempt=attempt, recorded=done)

    def _submit_job_work(
        self: Service,
        job_id: str,
        request: SynthesisRequest,
        spec: OutputSpec,
        *,
        attempt: int | None,
        recorded: threading.Event,
    ) -> Ticket:
        pieces = split_for_job(request.text, self.settings.limits.max_text_chars)

        def on_state(ticket: Ticket, state: str) -> None:
            recorded.wait(30.0)  # the record is written right after submit returns
            try:
                if state == "running":
                    if attempt is None:  # a claimed job is already running
                        self.jobs.mark_running(job_id)
                elif state == "done":
                    outcome: TtsOutcome = ticket.value
                    extra = {"warnings": list(outcome.warnings), "format": spec.format, "pieces": len(pieces)}
                    try:
                        self.jobs.finish_done(
                            job_id,
                            output_id=outcome.output_id,
                            output_path=outcome.output_path,
                            duration_s=outcome.duration_s,
                            seed=outcome.seed,
                            extra=extra,
                            attempt=attempt,
                        )
                    except JobStateError:
                        self._discard_output(outcome.output_id)  # another attempt owns the job's result
                        raise
                else:
                    error = ticket.error or Cancelled("cancelled")
                    self.jobs.finish_with_exception(job_id, error, attempt=attempt)
            except JobStateError as exc:
                log.warning("job %s: %s", job_id, exc)

        def work(ctx: WorkContext) -> TtsOutcome:
            with request_context(spec.request_id), self.synthesizer(ctx.cancel) as synth:
                result = self._run_engine(
                    lambda: self._run_pieces(ctx, synth, request, pieces, job_id, attempt)
                )
                ctx.check_cancelled()  # lost the job while finishing the last piece: no output
                return self._finish(synth, request, result, spec, encoded=False)

        return self.scheduler.submit(work, job_id=job_id, owner=spec.owner, on_state=on_state)

    def _discard_output(self: Service, output_id: str | None) -> None:
        if output_id is None:
            return
        try:
            self.outputs.delete(output_id)
        except Exception as exc:  # nothing refers to it; retention removes it later anyway
            log.warning("could not delete the unused output %s: %s", output_id, exc)

    def _run_pieces(
        self: Service,
        ctx: WorkContext,
        synth: Any,
        request: SynthesisRequest,
        pieces: list[str],
        job_id: str,
        attempt: int | None = None,
    ) -> SynthesisResult:
        results: list[SynthesisResult] = []
        seed = request.seed
        last_write = 0.0
        for index, piece in enumerate(pieces):
            ctx.check_cancelled()

            def progress(p: Any, index: int = index) -> None:
                nonlocal last_write
                fraction = (index + p.fraction) / len(pieces)
                ctx.set_progress(fraction)
                if time.monotonic() - last_write >= PROGRESS_WRITE_S:
                    last_write = time.monotonic()
                    self.jobs.set_progress(job_id, fraction, attempt=attempt)

            part = dataclasses.replace(request, text=piece, seed=seed)
            result = synth.synthesize(part, progress=progress, cancel=ctx.cancel).result()
            seed = result.seed  # later pieces reuse the first piece's seed: one seed reproduces the job
            results.append(result)
        return merge_results(results)

    def cancel_job(self: Service, job_id: str) -> JobRecord:
        """Cancel a queued or running job (JobStateError if it already ended)."""
        record = self.jobs.get(job_id)
        if record is None:
            raise JobNotFound(f"no job {job_id!r}: list your jobs with GET /v1/jobs")
        if record.is_terminal:
            raise JobStateError(
                f"job {job_id} already ended ({record.state}); only queued or running jobs cancel"
            )
        if self.remote is not None:
            return self.remote.cancel_job(job_id)
        if not self.scheduler.cancel(job_id, "cancelled by the client"):
            # Not in this process's scheduler (an earlier process's record): end the record itself.
            return self.jobs.finish_cancelled(job_id, "cancelled by the client")
        return self.jobs.get(job_id) or record

    # -- voices -------------------------------------------------------------------------------------------

    def submit_enrolment(
        self: Service,
        name: str,
        audio: bytes,
        transcript: str | None,
        *,
        suffix: str = ".wav",
        defaults: VoiceDefaults | None = None,
        lexicon: dict[str, str] | None = None,
        request_id: str | None = None,
    ) -> Ticket:
        """Analyse and store a new voice on a worker (the prompt models run on the accelerator too)."""
        self.require_ready()
        if self.remote is not None:
            return self.scheduler.submit(
                self.remote.enrol_work(
                    name, audio, transcript, suffix=suffix, defaults=defaults, lexicon=lexicon
                )
            )

        def work(ctx: WorkContext) -> Voice:
            with request_context(request_id), self.synthesizer(ctx.cancel) as synth:
                return synth.add_voice(
                    name, audio, transcript, audio_suffix=suffix, defaults=defaults, lexicon=lexicon
                )

        return self.scheduler.submit(work)


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


def split_for_job(text: str, max_chars: int) -> list[str]:
    """Pieces of at most `max_chars` characters, cut after sentences (else commas, else anywhere)."""
    if len(text.strip()) <= max_chars:
        return [text]
    units: list[str] = []
    for sentence in cut_after(text, SENTENCE_ENDS):
        if len(sentence) <= max_chars:
            units.append(sentence)
            continue
        for clause in cut_after(sentence, COMMAS):
            units.extend(clause[i : i + max_chars] for i in range(0, len(clause), max_chars))
    pieces: list[str] = []
    for unit in units:
        if pieces and len(pieces[-1]) + len(unit) <= max_chars:
            pieces[-1] += unit
        elif has_content(unit):
            pieces.append(unit)
        # else: punctuation that fits nowhere says nothing; it is dropped
    return pieces


def _job_params(request: SynthesisRequest, spec: OutputSpec) -> dict[str, Any]:
    return {**dataclasses.asdict(request), "format": spec.format, "sample_rate": spec.sample_rate}


def _new_id() -> str:
    return uuid.uuid4().hex


def _progress_to(ctx: WorkContext) -> Callable[[SynthesisProgress], None]:
    """Report a synthesis' sentence progress on its ticket (the UI's progress bar, job polling)."""
    return lambda progress: ctx.set_progress(progress.fraction)
