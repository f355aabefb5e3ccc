"""A text over the interactive limit, in the studio: an ordinary job (the same as POST /v1/jobs), followed
with a progress bar (sentences done / total, elapsed, estimated remaining), the finished pieces playable
while the rest is made, and the WAV (all formats) and SRT links at the end."""

from __future__ import annotations

import html
import time
from collections.abc import Iterator
from typing import Any

import gradio as gr
import numpy as np
import soundfile

from cosyserve.errors import CosyServeError
from cosyserve.ui.bridge import JobRecord, Principal, SynthesisRequest, TakeReport, TtsOutcome, UiBridge
from cosyserve.ui.file_owners import owned_folder
from cosyserve.ui.generate import Form, Run, Update, as_gr_error, finished
from cosyserve.ui.i18n import text
from cosyserve.ui.messages import stored_error_message

JOB_POLL_S = 0.5


def _clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def progress_html(
    fraction: float,
    total: int,
    elapsed: float,
    lang: str,
    queued: bool = False,
    place: tuple[int, float] | None = None,
) -> str:
    """The bar and its line: sentences done / total, elapsed, estimated remaining; while queued, its place
    in the queue and the estimated wait (`place`: position, seconds) when known."""
    percent = max(0.0, min(1.0, fraction)) * 100
    if queued and place is not None:
        line = text("job_queued_eta", lang, position=place[0], wait=round(place[1]))
    elif queued:
        line = text("job_queued", lang)
    else:
        remaining = elapsed * (1 - fraction) / fraction if fraction > 0.001 else None
        line = text(
            "job_progress",
            lang,
            done=round(fraction * total),
            total=total,
            elapsed=_clock(elapsed),
            remaining=_clock(remaining) if remaining is not None else "…",
        )
    said = html.escape(line, quote=True)  # (the bar's name for a screen reader: its line)
    return (
        f'<div class="cosy-progress" data-fraction="{fraction:.4f}">'
        f'<div class="cosy-bar" role="progressbar" aria-valuemin="0" aria-valuemax="100" '
        f'aria-valuenow="{percent:.0f}" aria-label="{said}"><div style="width:{percent:.1f}%"></div></div>'
        f"<div class='cosy-progress-line'>{html.escape(line)}</div></div>"
    )


def partial_wav(results: Any, folder: str, principal: Principal) -> str | None:
    """The finished pieces of a running job as one WAV in Gradio's cache (what can be played so far),
    for `principal` alone (`file_owners`)."""
    if not results:
        return None
    audio = np.concatenate([result.audio for result in results])
    target = owned_folder(folder, principal) / "partial.wav"
    soundfile.write(target, audio, results[0].sample_rate)
    return str(target)


def run_job(
    bridge: UiBridge,
    run: Run,
    principal: Principal,
    request: SynthesisRequest,
    form: Form,
    lang: str,
    cache_dir: str,
    request_id: str,
) -> Iterator[Update]:
    """Submit the job, yield progress (and the pieces so far) until it ends, then the result."""
    started = time.monotonic()
    note = text("long_text_job", lang, count=len(request.text.strip()), limit=bridge.max_text_chars)
    try:
        total = bridge.sentence_total(request.text)
        job_id = bridge.submit_job(
            principal, request, mode=form.mode, request_id=request_id, consent=form.consent
        )
    except Exception as exc:
        raise as_gr_error(exc, lang, request_id) from None
    run.attach(lambda: bridge.cancel_job(job_id))
    yield gr.update(), "", note, gr.update(), progress_html(0.0, total, 0.0, lang, queued=True), gr.update()
    shared = 0
    while True:
        record, ticket = bridge.job(job_id)
        if record is None:
            raise as_gr_error(CosyServeError(f"job {job_id} disappeared"), lang, request_id)
        if record.is_terminal:
            break
        fraction = max(record.progress, ticket.progress if ticket is not None else 0.0)
        partial = getattr(ticket, "partial", None) or ()
        audio: Any = gr.update()
        if len(partial) > shared:  # new pieces finished: play what there is so far
            shared = len(partial)
            audio = partial_wav(partial, cache_dir, principal)
        running = ticket is None or ticket.state == "running" or record.state == "running"
        position = ticket.position if ticket is not None else None
        place = (position, bridge.queue_wait_estimate(ticket)) if ticket and position is not None else None
        bar = progress_html(fraction, total, time.monotonic() - started, lang, not running, place)
        yield audio, gr.update(), note, gr.update(), bar, gr.update()
        time.sleep(JOB_POLL_S)
    if record.state != "done" and not record.output_id:  # stopped before any part was made
        if record.state == "cancelled":
            yield gr.update(), "", text("cancelled", lang), gr.update(), "", ""
            return
        why = f"⚠ {record.error_message or record.state}"
        yield gr.update(), "", why, gr.update(), "", gr.update()  # no bar left standing under the error
        raise as_gr_error(CosyServeError(record.error_message or record.state), lang, request_id)
    outcome = TtsOutcome(
        seed=record.seed or 0,
        duration_s=record.duration_s or 0.0,
        speech_tokens=0,
        output_id=record.output_id,
        output_path=None,
        media_type="audio/wav",
        warnings=tuple((record.result_extra or {}).get("warnings", [])),
        quality=job_quality(record),  # the take badge (it was missing: a failed take looked clean)
    )
    elapsed = time.monotonic() - started
    if record.state != "done":  # stopped midway (a cancel, the quota, a revoked key): what it made
        done = finished(bridge, principal, form, outcome, lang, elapsed, cache_dir, False)
        yield done[0], done[1], stopped_note(record, lang) + "\n\n" + str(done[2]), done[3], "", done[5]
        return
    done = finished(bridge, principal, form, outcome, lang, elapsed, cache_dir, run.cancelled)
    bar = progress_html(1.0, total, time.monotonic() - started, lang)
    yield done[0], done[1], note + "\n\n" + str(done[2]), done[3], bar, done[5]


def job_quality(record: JobRecord) -> TakeReport | None:
    """The checks of a job's result as its record keeps them (None: not checked)."""
    kept = (record.result_extra or {}).get("quality")
    try:
        return TakeReport.from_dict(kept) if isinstance(kept, dict) else None
    except (TypeError, ValueError, KeyError):  # written by another version: no badge rather than none at all
        return None


def stopped_note(record: JobRecord, lang: str) -> str:
    """Why a job that kept a partial result stopped, and which part of it is there."""
    if record.state == "cancelled":
        why = text("cancelled", lang)
    else:  # in the page's language, a sentence of its own (it ran on into the next one)
        why = "⚠ " + (stored_error_message(record.error_code, record.error_message, lang) or record.state)
    if why[-1:] not in ".。!！?？)）":
        why += "。" if lang == "zh" else "."
    partial = (record.result_extra or {}).get("partial") or {}
    if not partial:
        return why
    kept = text(
        "job_kept_partial",
        lang,
        done=partial.get("segments_done", 0),
        total=partial.get("segments_total", 0),
        seconds=float(partial.get("audio_s") or record.duration_s or 0.0),
        missing=int(partial.get("missing_from", 0)) + 1,
    )
    return f"{why} {kept}"
