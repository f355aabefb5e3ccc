"""What happens to a synthesis once its audio exists, in one place: `Results`.

The backend builds one `Results` and hands it to everything that synthesises (one-shot and streamed
requests, long-text jobs, batch items and dub cues), so a result's life reads top to bottom here:
labels (the explicit cue and response labels) → WAV encoding → provenance manifest → stored file →
metrics → quota settled → first-synthesis clock → the `TtsOutcome` the caller gets. Engine calls go
through `run_engine`, which turns an accelerator running out of memory into `OutOfMemory` and tells the
model host how the call ended (for readiness).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from cosyserve.engine.memory import out_of_memory_as_error
from cosyserve.service.audio_formats import encode, mime_type
from cosyserve.service.labels.labeller import Labeller
from cosyserve.service.local.model_host import ModelHost
from cosyserve.service.local.synthesizer import Synthesizer
from cosyserve.service.logs import log_failure
from cosyserve.service.metrics import Metrics
from cosyserve.service.outcomes import SynthesisResult, TtsOutcome
from cosyserve.service.requests import OutputSpec, SynthesisRequest
from cosyserve.service.reservations import QuotaReservations
from cosyserve.service.startup_clock import StartupClock
from cosyserve.service.stores.outputs import OutputStore, StoredOutput, build_manifest

T = TypeVar("T")


@dataclass(frozen=True)
class Results:
    """Stores, counts and settles every synthesis this process makes; runs its engine calls."""

    host: ModelHost  # told how each engine call ended (out of memory does not count against readiness)
    outputs: OutputStore
    metrics: Metrics
    startup: StartupClock
    reservations: QuotaReservations  # a result settles its request's reservation with what it made
    upload_outputs: bool  # outputs go to the bucket before the answer (a worker's API node reads them there)
    labels: Labeller = dataclasses.field(default_factory=Labeller.disabled)

    def run_engine(self, call: Callable[[], T]) -> T:
        """`call()`, out of memory raised as `OutOfMemory` (which does not count against readiness)."""
        try:
            with out_of_memory_as_error("synthesis"):
                return call()
        except BaseException as exc:
            self.host.note_result(exc)
            raise

    def finish(
        self,
        synth: Synthesizer,
        request: SynthesisRequest,
        result: SynthesisResult,
        spec: OutputSpec,
        *,
        encoded: bool,
        make_room: Callable[[], object] | None = None,
        fails_the_job: bool = False,
    ) -> TtsOutcome:
        """Store the result with its manifest, count it, settle its quota, and encode the response if
        `encoded` (the caller waits for the whole file; a stream sent its bytes already). A failed save is
        tried once more after `make_room()`; with `fails_the_job` it is not counted here (the failed job
        is: a job that could not save was counted as three storage errors and twice its audio)."""
        self.host.note_result(None)
        produced = result  # what the engine made: metrics and the quota count it, not the cue
        explicit = self.labels.explicit_for(synth, request, spec.extra, spec.voice_scope)
        result = self.labels.with_explicit(result, explicit)  # the audio delivered and stored
        stored, storage_error = self._store(synth, request, result, spec, count=not fails_the_job)
        if stored is None and make_room is not None:
            make_room()
            stored, storage_error = self._store(synth, request, result, spec, count=not fails_the_job)
        audio = self._response_audio(synth, request, result, spec, stored) if encoded else None
        total_s = produced.stage_seconds.get("total", 0.0)
        self.metrics.observe_synthesis(produced.duration_s, total_s)
        self.metrics.observe_take(produced.quality)
        self.startup.first_synthesis(total_s, produced.duration_s)
        self.reservations.settle(spec, produced.duration_s)  # replaces its reservation (jobs: key None)
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
            quality=produced.quality,
            speech_s=produced.duration_s,
        )

    def _store(
        self,
        synth: Synthesizer,
        request: SynthesisRequest,
        result: SynthesisResult,
        spec: OutputSpec,
        *,
        count: bool,
    ) -> tuple[StoredOutput | None, str | None]:
        """The result as a WAV at the model's rate with its manifest: (stored, None), or (None, why) when
        saving failed (a waiting caller still gets its audio, marked unsaved; jobs fail)."""
        rate = result.sample_rate
        with out_of_memory_as_error("encoding the audio"):
            wav = encode(result.audio, "wav", source_rate=rate)
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
        try:
            return self.outputs.save(wav, "wav", manifest, upload_now=self.upload_outputs), None
        except Exception as exc:
            log_failure("storage_error", f"saving the output in {self.outputs.root} failed: {exc}", exc=exc)
            if count:
                self.metrics.count_error("storage_error")
            return None, str(exc) or type(exc).__name__

    def _response_audio(
        self,
        synth: Synthesizer,
        request: SynthesisRequest,
        result: SynthesisResult,
        spec: OutputSpec,
        stored: StoredOutput | None,
    ) -> bytes:
        """The response body: the stored file as it is when it is what was asked (its label and manifest
        too), else encoded as asked and labelled like the stored file (same id, or the request id if it
        was not saved)."""
        rate = result.sample_rate
        if stored is not None and spec.format == "wav" and spec.sample_rate == rate:
            return stored.path.read_bytes()
        with out_of_memory_as_error("encoding the audio"):
            return self.labels.label_file(
                encode(result.audio, spec.format, source_rate=rate, sample_rate=spec.sample_rate),
                spec.format,
                stored.id if stored else (spec.request_id or "unsaved"),
                model=synth.model_dir.fingerprint,
                voice=request.voice,
            )
