"""Running one synthesis for the UI: build the request, submit it, follow it, and say what went wrong.

Every failure reaches the page as a short message in the user's language (`as_gr_error`): input problems
with the service's own explanation, busy/not-ready/expired-login cases with a translated sentence, and
anything unexpected as "something went wrong (request id …)" while the details go to the log.
"""

from __future__ import annotations

import base64
import html
import shutil
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from cosyserve.errors import Cancelled, CosyServeError
from cosyserve.ui.bridge import (
    DOWNLOAD_FORMATS,
    MAX_SEED,
    Principal,
    StoredOutput,
    SynthesisRequest,
    Ticket,
    TtsOutcome,
    UiBridge,
    VoiceNotFound,
    log_failure,
    manifest_timings,
    to_srt,
)
from cosyserve.ui.file_owners import owned_folder
from cosyserve.ui.i18n import text
from cosyserve.ui.i18n_warnings import say_warnings
from cosyserve.ui.messages import UiError, error_message
from cosyserve.ui.preview import form_preview
from cosyserve.ui.take_badge import take_badge

POLL_S = 0.25
MAX_CANCELLED_CLICKS = 4096  # tokens of clicks cancelled before they started, oldest forgotten first
STREAM_ITEM_TIMEOUT_S = 600.0


def as_gr_error(exc: BaseException, lang: str, request_id: str | None = None) -> gr.Error:
    """A Gradio error modal for `exc`; unexpected exceptions are logged with their traceback first."""
    if isinstance(exc, gr.Error):
        return exc
    if not isinstance(exc, (UiError, CosyServeError)):
        log_failure("ui", f"web UI request {request_id} failed: {exc}", exc=exc)
    message = html.escape(error_message(exc, lang, request_id))
    return gr.Error(message, title=text("error_title", lang), print_exception=False)


@dataclass
class Form:
    """The synthesis inputs of one mode tab, as the page sends them."""

    mode: str  # zero_shot, cross_lingual or instruct
    voice: str | None = None  # saved voice id ("" or None: use the recording)
    prompt: str | None = None  # uploaded/recorded file path
    transcript: str | None = None
    preset: str | None = None
    instruct: str | None = None
    text: str = ""
    seed: str | None = None  # digits, or empty for a random one
    speed: float = 1.0
    volume: float = 1.0
    takes: float | None = None  # 1..bridge.max_takes (a slider sends a float); None: the server's
    stream: bool = False
    denoise: bool = False  # suppress noise in the uploaded recording first
    consent: bool = False  # the consent statement confirmed for the recording (user keys must)
    fmt: str = "wav"  # the format recorded as chosen (every format is offered as a link anyway)
    extra: dict[str, Any] = field(default_factory=dict)


def build_request(
    bridge: UiBridge, principal: Principal | None, form: Form, *, allow_long: bool = False
) -> SynthesisRequest:
    """The service request for a form; UiError for what the UI can tell is missing or too long.

    A saved voice wins over the recording and the transcript fields, and the page disables those fields
    while one is selected: its own recording and transcript are used, whatever the boxes still hold.
    `allow_long`: the text may exceed the interactive limit (it goes to a job)."""
    spoken = unicodedata.normalize("NFC", form.text or "").strip()
    if not spoken:
        raise UiError("err_no_text")
    limit = bridge.max_text_chars
    if len(spoken) > limit and not allow_long:
        raise UiError("err_too_long", count=len(spoken), limit=limit)
    if len(spoken) > bridge.max_job_chars:
        raise UiError("err_job_too_long", count=len(spoken), limit=bridge.max_job_chars)
    seed = None
    seed_text = str(form.seed if form.seed is not None else "").strip()
    if seed_text:
        if not seed_text.isdigit() or int(seed_text) > MAX_SEED:
            raise UiError("err_seed", limit=MAX_SEED)
        seed = int(seed_text)
    takes = None
    if form.takes is not None:
        if float(form.takes) != int(form.takes) or not 1 <= int(form.takes) <= bridge.max_takes:
            raise UiError("err_takes", limit=bridge.max_takes)
        takes = int(form.takes)
    transcript = (form.transcript or "").strip() or None
    instruct = (form.instruct or "").strip() or (form.preset or "").strip() or None
    common: dict[str, Any] = {
        "text": form.text,
        "seed": seed,
        "speed": float(form.speed),
        "volume": float(form.volume),
        "takes": takes,
    }
    if form.mode == "instruct" and instruct is None:
        raise UiError("err_no_instruct")
    if form.voice:
        try:
            voice = bridge.voice(principal, form.voice)
        except VoiceNotFound as exc:  # deleted since the list was shown (here, in another tab, by an admin)
            if type(exc) is not VoiceNotFound:
                raise
            raise UiError("err_voice_gone") from None
        if form.mode == "zero_shot":
            if not voice.transcript:
                raise UiError("err_no_transcript")
            return SynthesisRequest(voice=voice.id, instruct="", **common)  # the voice's own transcript
        if form.mode == "cross_lingual":  # "" overrides the voice's transcript and default instruction
            return SynthesisRequest(voice=voice.id, prompt_text="", instruct="", **common)
        return SynthesisRequest(voice=voice.id, instruct=instruct, **common)
    if not form.prompt:
        raise UiError("err_no_prompt")
    if form.mode == "zero_shot" and transcript is None:
        raise UiError("err_no_transcript")
    bridge.check_prompt(form.prompt)  # fails fast, before a queue slot is taken
    audio, _ = bridge.read_upload(form.prompt)
    return SynthesisRequest(
        prompt_wav=audio,
        prompt_text=transcript if form.mode == "zero_shot" else None,
        instruct=instruct if form.mode == "instruct" else None,
        denoise=bool(form.denoise),
        **common,
    )


class Run:
    """One Generate click, registered before anything is submitted, so that a Cancel arriving before
    the ticket exists is not lost (it cancels the ticket as soon as it is attached)."""

    def __init__(self, click: str = "") -> None:
        self.click = click  # the page's token of the click ("": none)
        self.cancelled = False
        self._stops: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def attach(self, stop: Callable[[], None]) -> None:
        with self._lock:
            self._stops.append(stop)
            cancelled = self.cancelled
        if cancelled:
            stop()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            stops = list(self._stops)
        for stop in stops:
            stop()

    def check(self) -> None:
        if self.cancelled:
            raise Cancelled("cancelled in the web UI")


class TicketRegistry:
    """Running UI work by browser session, so the Cancel button can stop it; and the Generate clicks
    cancelled while they still waited in the page's queue (by the token the page gave each click), so
    that such a click ends as cancelled as soon as its handler starts, without submitting anything."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, set[Run]] = {}
        self._cancelled_clicks: OrderedDict[tuple[str, str], None] = OrderedDict()

    def begin(self, session: str, click: str = "") -> Run:
        run = Run(click)
        with self._lock:
            self._runs.setdefault(session, set()).add(run)
            if click and (session, click) in self._cancelled_clicks:
                del self._cancelled_clicks[(session, click)]
                run.cancelled = True
        return run

    def end(self, session: str, run: Run) -> None:
        with self._lock:
            runs = self._runs.get(session)
            if runs is not None:
                runs.discard(run)
                if not runs:
                    del self._runs[session]

    def add(self, session: str, ticket: Ticket) -> Run:
        """A run holding just `ticket` (the voice library's previews and enrolments)."""
        run = self.begin(session)
        run.attach(lambda: ticket.finished or ticket.cancel("cancelled in the web UI"))
        return run

    def cancel(self, session: str, click: str = "") -> int:
        """Cancel the session's running work; `click`, when no run has it yet, is cancelled as it starts.
        (A token of a click that has already ended is kept too, harmlessly: tokens are never reused.)"""
        with self._lock:
            runs = list(self._runs.get(session, ()))
            if click and all(run.click != click for run in runs):
                self._cancelled_clicks[(session, click)] = None
                while len(self._cancelled_clicks) > MAX_CANCELLED_CLICKS:
                    self._cancelled_clicks.popitem(last=False)
        for run in runs:
            run.cancel()
        return len(runs)


def cache_copy(path: str | Path, cache_dir: str, principal: Principal | None) -> str:
    """A copy of a stored file in Gradio's cache (a fresh random folder), which is what the page may load:
    the output store itself is never exposed by path. Only `principal` (and admins) may fetch the copy
    (`file_owners`)."""
    target = owned_folder(cache_dir, principal) / Path(path).name
    shutil.copyfile(path, target)
    return str(target)


def links_html(bridge: UiBridge, output: StoredOutput, lang: str, chosen: str = "wav") -> str:
    """Download links to the output store in every format (through the user's sign-in: `download_url`),
    and the subtitles (SRT) made from the
    sentence timings; `chosen` is only remembered, every format is offered."""
    del chosen
    return download_links(bridge, output, lang, lambda fmt: (text("download", lang, fmt=fmt), f"⬇ {fmt}"))


def download_links(
    bridge: UiBridge, output: StoredOutput, lang: str, labels: Callable[[str], tuple[str, str]]
) -> str:
    """A link to `output` in each of DOWNLOAD_FORMATS, `labels(FORMAT)` giving its (title, text),
    then its subtitles (SRT) as a data link when its manifest has sentence timings."""
    parts = []
    for fmt in DOWNLOAD_FORMATS:
        url = html.escape(bridge.download_url(output, fmt), quote=True)
        title, shown = (html.escape(label, quote=True) for label in labels(fmt.upper()))
        parts.append(
            f'<a class="cosy-download" data-format="{fmt}" href="{url}" title="{title}" aria-label="{title}" '
            f'download="{output.id}.{fmt}">{shown}</a>'
        )
    srt = srt_text(output.manifest)
    if srt:
        data = base64.b64encode(srt.encode("utf-8")).decode("ascii")
        href = f"data:application/x-subrip;charset=utf-8;base64,{data}"
        label = html.escape(text("subtitles", lang))
        name = f"{output.id}.srt"
        parts.append(
            f'<a class="cosy-download" data-format="srt" href="{href}" download="{name}">'
            f'<span aria-hidden="true">⬇ </span>{label}</a>'
        )
    return f'<div class="cosy-links">{"".join(parts)}</div>'


def srt_text(manifest: dict[str, Any]) -> str:
    timings = manifest_timings(manifest)
    return to_srt(timings) if timings else ""


def result_info(outcome: TtsOutcome, lang: str, elapsed: float) -> str:
    info = text("result_info", lang, seed=outcome.seed, duration=outcome.duration_s, elapsed=elapsed)
    badge = take_badge(outcome.quality, lang)
    info += f" · {badge}" if badge else ""
    warnings = "".join(f"\n- ⚠ {html.escape(w)}" for w in say_warnings(outcome.warnings, lang))
    return info + (("\n" + warnings) if warnings else "")


Update = tuple[Any, Any, Any, Any, Any, Any]  # result, links, info, stream box, progress, preview
KEEP: Update = (gr.update(),) * 6


def finished(
    bridge: UiBridge,
    principal: Principal,
    form: Form,
    outcome: TtsOutcome,
    lang: str,
    elapsed: float,
    cache_dir: str,
    late: bool,
) -> Update:
    """The updates for a stored result: its audio, links (all formats and SRT), info and text preview."""
    info = result_info(outcome, lang, elapsed)
    if late:  # the cancel came after the last sentence was made: say what really happened
        info = text("cancel_too_late", lang) + "\n\n" + info
    if outcome.output_id is None:  # storing failed (logged by the service): nothing to show or download
        return None, "", info, gr.update(), "", ""
    output = bridge.made_output(outcome.output_id)
    audio = cache_copy(output.path, cache_dir, principal)
    preview = form_preview(bridge, principal, form, lang, output.manifest.get("sentences"))
    return audio, links_html(bridge, output, lang), info, gr.update(), "", preview
