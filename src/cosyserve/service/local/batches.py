"""Running a batch (or a dub) on the local backend: its items in order, one synthesis at a time.

A batch is one job on the scheduler; its work takes the first unfinished item (`BatchStore`), so an
attempt that follows a restart goes on where the last one stopped. Each item is stored as an output of its
own and charged to the key's quota; an item that cannot be made (bad text, unknown voice, its own timeout,
a failed save) fails alone with its reason and the batch goes on. A dub then writes its cues' audio into
one track on disk (`dub_track`), stored as the job's result. A batch item is charged its audio; a dub is
charged its track's length (`dub_plan`): each cue its share as it is made, the track the rest.

An item found running when a batch resumes was interrupted: if its output was saved before the crash, it
is adopted instead of being made twice.

Each saved voice is pinned once per attempt (`voice_pins`), from the snapshot taken at submit. The key is
checked before each item starts and again before a finished item is charged: a revoked key stops the
batch there (`key_revoked`), and an item made after the revoke is neither charged nor kept.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import soundfile as sf

from cosyserve.errors import Cancelled, CosyServeError, ModelNotReady, StorageError, error_code
from cosyserve.limits import DEFAULT_DUB_MAX_SPEED
from cosyserve.service.access.key_watch import KeyChanged, KeyRevoked
from cosyserve.service.batches.dub_plan import CueSlot, track_seconds_of_items
from cosyserve.service.batches.dub_track import write_track
from cosyserve.service.batches.items import BatchPrompt, ItemParams, batch_request, item_request
from cosyserve.service.labels.labeller import OPT_OUT
from cosyserve.service.local.dubbing import synthesize_cue
from cosyserve.service.local.long_text_jobs import JobResult, JobRun, stop_reason
from cosyserve.service.local.model_host import ModelHost
from cosyserve.service.local.results import Results
from cosyserve.service.local.voice_pins import SNAPSHOTS, VoicePins
from cosyserve.service.outcomes import SentenceTiming, SynthesisResult, TtsOutcome
from cosyserve.service.quality.reporting import saved_report, stored_fields
from cosyserve.service.requests import OutputSpec, VoiceScope
from cosyserve.service.scheduling.tickets import WorkContext
from cosyserve.service.stores.batches import UNFINISHED, BatchItem, BatchStore
from cosyserve.service.stores.output_files import temp_output_path
from cosyserve.service.stores.outputs import OutputStore, StoredOutput, build_manifest

log = logging.getLogger(__name__)

UNEXPECTED_FAILURES_LIMIT = 3  # unexpected errors in a row (bugs, the engine failing) stop the batch
ORPHAN_SCAN = 200  # recent outputs looked through for an interrupted item's saved output
BACKSTOP_GRACE_S = 60.0  # past its own clocks, an item that still runs is stuck: the batch stops


class ItemsFailed(CosyServeError):
    """Every item of a batch failed (each item's error says why)."""


class ItemCancel(threading.Event):
    """An item's cancel: its own deadline, or its batch's cancel. The engine polls `is_set`, so a late
    item fails alone while a cancelled batch stops."""

    def __init__(self, batch: threading.Event, timeout_s: float) -> None:
        super().__init__()
        self.batch = batch
        self.deadline = time.monotonic() + timeout_s

    def is_set(self) -> bool:
        return super().is_set() or self.batch.is_set() or time.monotonic() > self.deadline


@dataclass(frozen=True)
class BatchPlan:
    """A batch or a dub as its work runs it: shared settings, the uploaded prompt, how outputs are kept."""

    job_id: str
    kind: str  # "batch" or "dub"
    shared: dict[str, Any]  # the job record's params (voice, prompt_text, max_speed, ...)
    prompt_wav: bytes | None
    spec: OutputSpec  # owner and request id of every output (never a key: items are charged here)
    voices: VoiceScope  # the saved voices its caller may use

    @property
    def prompt(self) -> BatchPrompt:
        """The uploaded recording the items without a voice of their own speak in."""
        return BatchPrompt(self.prompt_wav, self.shared.get("prompt_text"))


@dataclass(frozen=True)
class BatchRunner:
    """Runs `BatchPlan`s; `results` stores and counts each item (`local.results`)."""

    host: ModelHost
    batches: BatchStore
    outputs: OutputStore
    results: Results  # stores, counts and settles each item's synthesis; runs its engine calls

    def run(self, ctx: WorkContext, plan: BatchPlan, run: JobRun) -> JobResult:
        """Every unfinished item in order; then the dub's track. Stops between items when cancelled, when
        the key's quota ran out, or when the key was revoked (what finished is kept)."""
        stopped: CosyServeError | None = None
        unexpected = 0
        pins, first = VoicePins(self.host.voices, plan.shared.get(SNAPSHOTS), plan.voices), True
        counts = self.batches.counts(plan.job_id)  # (items an earlier attempt made count as made)
        while (item := self.batches.next_unfinished(plan.job_id)) is not None:
            # Each item is a unit: other work may have the engine in between. The first runs in the slot
            # the ticket started with (giving it back before any work would count an empty unit).
            try:
                if first:
                    ctx.check_cancelled()
                else:
                    ctx.next_unit()
                first = False
                if not run.quota.allows_id(run.key_id, run.job_id):
                    stopped = run.quota.exceeded(run.key_id)
                    break
                # a revoke found before any item was made says that nothing was (not "kept and charged")
                run.check_key(pins.voices(), stage="segment" if counts.done else "start")
                unexpected = self._item(ctx, plan, run, item, unexpected, pins)
            except (KeyRevoked, KeyChanged) as exc:
                stopped = exc
                break
            except Cancelled as exc:  # a client's cancel keeps what finished and says what is missing
                stopped = stop_reason(exc, ctx, run)
                if stopped is None:  # a shutdown, a timeout, a lost attempt: not a stop that keeps work
                    raise
                break
            counts = self.batches.counts(plan.job_id)
            fraction = counts.finished / max(1, counts.total)
            ctx.set_progress(fraction)
            run.jobs.set_progress(plan.job_id, fraction, attempt=run.attempt)
        if stopped is None:  # a cancel from another node ends the items first: no item left is no success
            ctx.check_cancelled()
        counts = self.batches.counts(plan.job_id)
        extra = {"items": counts.total, "done": counts.done, "failed": counts.failed}
        if counts.done == 0:
            raise stopped or ItemsFailed(f"all {counts.total} items failed: see each item's error")
        outcome = None
        if plan.kind == "dub":  # stopped by the quota: the track ends where the first cue not made starts
            try:
                outcome = self._track(plan, self._first_unmade_start(plan) if stopped else None)
            except StorageError:
                # No track: its key keeps paying for the speech its cues made (each downloadable as an
                # item), not for a track's length it never gets.
                speech_s = float(self.batches.kept(plan.job_id).get("audio_s") or 0.0)
                run.quota.refund_discarded(run.key_id, plan.job_id, keep_s=speech_s)
                raise
            extra.update(track_s=round(outcome.duration_s, 3), charged_s=self._charge_rest(run, outcome))
        kept = self.batches.kept(plan.job_id)
        extra["audio_s"] = kept["audio_s"]
        if stopped is not None:  # the finished items stay downloadable; say which are missing
            extra["partial"] = kept["partial"]
        return JobResult(outcome, extra, stopped)

    # -- one item ---------------------------------------------------------------------------------------

    def _item(
        self,
        ctx: WorkContext,
        plan: BatchPlan,
        run: JobRun,
        item: BatchItem,
        unexpected: int,
        pins: VoicePins,
    ) -> int:
        """Run one item to its end (done or failed); returns the count of unexpected failures in a row.
        KeyRevoked / KeyChanged when the key may no longer go on (the item, if made, is dropped)."""
        if item.state == "running" and self._adopt(plan, run, item):
            return unexpected
        if not self.batches.start(plan.job_id, item.position, run.attempt):
            raise Cancelled("this attempt lost the batch (cancelled, or taken over)")
        # A backstop for work that stops answering; each synthesis has its own clock (`ItemCancel`).
        backstop = run.segment_timeout_s * 3 + BACKSTOP_GRACE_S
        ctx.set_timeout(backstop, f"item {item.position} stopped answering for {backstop:g} s")
        started = time.monotonic()
        try:
            outcome, result = self._make(ctx, plan, run, item, pins)
        except Cancelled:
            if ctx.cancel.is_set():
                raise
            error = ("timeout", f"it ran longer than {run.segment_timeout_s:g} s (job_segment_timeout_s)")
        except ModelNotReady:
            raise
        except CosyServeError as exc:
            error = (error_code(exc), str(exc))
        except Exception as exc:  # a bug or an engine failure: this item fails; a run of them stops it all
            log.exception("batch %s: item %d failed", plan.job_id, item.position)
            if unexpected + 1 >= UNEXPECTED_FAILURES_LIMIT:
                raise
            self.batches.finish(plan.job_id, item.position, run.attempt, error=("internal", str(exc)))
            return unexpected + 1
        else:
            if outcome.output_id is None:
                reason = outcome.storage_error or "see the server log"
                error = ("storage_error", f"its audio could not be saved ({reason})")
            else:
                self._check_before_charge(plan, run, item, outcome, pins)
                recorded = self.batches.finish(
                    plan.job_id,
                    item.position,
                    run.attempt,
                    output_id=outcome.output_id,
                    duration_s=round(outcome.duration_s, 3),
                    seed=outcome.seed,
                    run_s=round(time.monotonic() - started, 3),
                    result=result,
                )
                if recorded:  # charged once kept: an item made after a cancel is never charged
                    run.quota.charge(run.key_id, plan.job_id, _charge_s(plan, item, outcome))
                else:  # the batch was cancelled or taken over meanwhile: nothing refers to it
                    self._discard(outcome.output_id)
                return 0
        self.batches.finish(plan.job_id, item.position, run.attempt, error=error)
        return unexpected

    def _check_before_charge(
        self, plan: BatchPlan, run: JobRun, item: BatchItem, outcome: TtsOutcome, pins: VoicePins
    ) -> None:
        """The key once more before the item is charged: made after a revoke, it is dropped instead."""
        try:
            run.check_key(pins.voices())
        except (KeyRevoked, KeyChanged) as exc:
            if outcome.output_id is not None:
                self._discard(outcome.output_id)
            self.batches.finish(plan.job_id, item.position, run.attempt, error=(error_code(exc), str(exc)))
            raise

    def _make(
        self, ctx: WorkContext, plan: BatchPlan, run: JobRun, item: BatchItem, pins: VoicePins
    ) -> tuple[TtsOutcome, dict[str, Any]]:
        request = item_request(ItemParams.of(item.params), plan.prompt)

        def cancel() -> threading.Event:
            return ItemCancel(ctx.cancel, run.segment_timeout_s)

        spec = dataclasses.replace(
            plan.spec,
            extra={**plan.spec.extra, "batch_id": plan.job_id, "item": item.position, "name": item.name},
        )
        if plan.kind == "dub":  # a cue before each line would shift it off its slot in the track
            spec.extra[OPT_OUT] = False
        with self.host.synthesizer(work=ctx) as synth:
            pinned = pins.pin(request.voice, synth.voice_features)  # VoiceUnavailable: this item fails
            if plan.kind == "dub":
                max_speed = float(plan.shared.get("max_speed") or DEFAULT_DUB_MAX_SPEED)
                slot = CueSlot.of(item.params).slot_s
                cue = self.results.run_engine(
                    lambda: synthesize_cue(synth, request, slot, max_speed, cancel, plan.voices, pinned)
                )
                request = dataclasses.replace(request, speed=cue.speed)
                result, extra = cue.result, {"speed": cue.speed, "natural_s": round(cue.natural_s, 3)}
            else:
                result = self.results.run_engine(
                    lambda: synth.synthesize(
                        request, cancel=cancel(), voices=plan.voices, pinned=pinned
                    ).result()
                )
                extra = {}
            outcome = self.results.finish(synth, request, result, spec, encoded=False)
            return outcome, {**extra, **stored_fields(outcome.quality)}

    def _discard(self, output_id: str) -> None:
        try:
            self.outputs.delete(output_id)
        except Exception as exc:  # retention removes it later anyway
            log.warning("could not delete the unused output %s: %s", output_id, exc)

    def _adopt(self, plan: BatchPlan, run: JobRun, item: BatchItem) -> bool:
        """Record an interrupted item done with the output its earlier attempt saved, if there is one."""
        found = _saved_item(self.outputs, plan, item.position)
        if found is None or not self.batches.start(plan.job_id, item.position, run.attempt):
            return False
        manifest = found.manifest
        log.info("batch %s: item %d was saved before the interruption: kept", plan.job_id, item.position)
        recorded = self.batches.finish(
            plan.job_id,
            item.position,
            run.attempt,
            output_id=found.id,
            duration_s=manifest.get("duration_s"),
            seed=manifest.get("seed"),
            result={
                **({"speed": manifest.get("speed")} if plan.kind == "dub" else {}),
                **stored_fields(saved_report(manifest)),
            }
            or None,
        )
        if recorded:  # the earlier attempt died before it charged it (it charges once it recorded it)
            made_s = float(manifest.get("duration_s") or 0.0)  # its speech: labels are added on download
            charge_s = float(item.params.get("share_s") or 0.0) if plan.kind == "dub" else made_s
            run.quota.charge(run.key_id, plan.job_id, charge_s)
        return recorded

    # -- a dub's track ----------------------------------------------------------------------------------

    def _track(self, plan: BatchPlan, until_s: float | None = None) -> TtsOutcome:
        """Write every finished cue at its start into one track on disk (`dub_track`: one cue in memory at
        a time, silence in blocks), store it, and return it as the result; `until_s`: end it there."""
        items = self.batches.items(plan.job_id)
        done = [item for item in items if item.state == "done" and item.output_id]
        rate = self._rate(done)
        track_s = track_seconds_of_items(item.params for item in items)
        if until_s is not None:
            track_s = min(track_s, round(until_s, 3))
        cues = [(CueSlot.of(item.params), self._cue_audio(item)) for item in items]
        temp = temp_output_path(self.outputs.root, "wav")
        try:
            placements = write_track(temp, cues, track_s, rate)
        except (OSError, sf.SoundFileRuntimeError) as exc:
            temp.unlink(missing_ok=True)
            free_mb = shutil.disk_usage(self.outputs.root).free / 1e6
            raise StorageError(
                f"the dub's track ({track_s:.0f} s, {track_s * rate * 2 / 1e6:.0f} MB) could not be written "
                f"in {self.outputs.root} ({exc}; {free_mb:.0f} MB free): make room there, "
                "then submit the dub again"
            ) from exc
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        timings = [
            SentenceTiming(item.position, item.params.get("text", ""), p.start_s, p.actual_end_s)
            for item, p in zip(items, placements, strict=True)
            if p is not None
        ]
        # The audio is on disk, not here: the manifest's duration is the track's.
        result = SynthesisResult(audio=np.zeros(0, np.float32), sample_rate=rate, seed=0, timings=timings)
        request = batch_request(plan.shared, (item.params for item in items))
        parameters = {"endpoint": "dub", "batch_id": plan.job_id, "request_id": plan.spec.request_id}
        manifest = build_manifest(
            request,
            result,
            format="wav",
            sample_rate=rate,
            model_checksum=str(self.host.info.get("fingerprint") or ""),
            owner=plan.spec.owner,
            parameters=parameters,
        )
        duration_s = round(track_s * rate) / rate
        manifest["duration_s"] = round(duration_s, 3)
        try:
            stored = self.outputs.save(temp, "wav", manifest)  # moved in: never read whole
        finally:
            temp.unlink(missing_ok=True)
        return TtsOutcome(
            seed=0,
            duration_s=duration_s,
            speech_tokens=0,
            output_id=stored.id,
            output_path=str(stored.path),
            media_type="audio/wav",
        )

    def _first_unmade_start(self, plan: BatchPlan) -> float | None:
        """Where the first cue a stopped dub did not get to starts (None: it got to every cue)."""
        items = self.batches.items(plan.job_id)
        return min((CueSlot.of(i.params).start_s for i in items if i.state in UNFINISHED), default=None)

    def _rate(self, done: list[BatchItem]) -> int:
        """The cues' sample rate (the model's when none was made)."""
        if done:
            return int(sf.info(str(self.outputs.get(done[0].output_id or "").path)).samplerate)
        return int(self.host.info.get("sample_rate") or 24000)

    def _cue_audio(self, item: BatchItem) -> Callable[[], np.ndarray | None]:
        """Reads a finished cue's audio when the track writer gets to it (None: no audio, left silent)."""
        if item.state != "done" or not item.output_id:
            return lambda: None
        output_id = item.output_id
        return lambda: sf.read(self.outputs.get(output_id).path, dtype="float32")[0]

    def _charge_rest(self, run: JobRun, track: TtsOutcome) -> float:
        """Charge what the cues' shares left of the track's length (cues that failed, or were adopted after
        a restart); returns all the dub was charged: the track's length."""
        record = run.jobs.get(run.job_id)
        charged = float(record.charged_s or 0.0) if record is not None else 0.0
        rest = round(track.duration_s - charged, 3)
        if rest > 0:
            run.quota.charge(run.key_id, run.job_id, rest)
            charged += rest
        return round(charged, 3)


def _charge_s(plan: BatchPlan, item: BatchItem, outcome: TtsOutcome) -> float:
    """What finishing an item charges: a batch item its audio; a dub's cue its share of the track (the dub
    is charged its track's length, `dub_plan`)."""
    if plan.kind == "dub":
        return float(item.params.get("share_s") or 0.0)
    return outcome.speech_s if outcome.speech_s is not None else outcome.duration_s  # not its label


def _saved_item(outputs: OutputStore, plan: BatchPlan, position: int) -> StoredOutput | None:
    for output in outputs.list(owner=plan.spec.owner, limit=ORPHAN_SCAN):
        parameters = output.manifest.get("parameters") or {}
        if parameters.get("batch_id") == plan.job_id and parameters.get("item") == position:
            return output
    return None
