"""The web UI end to end, in headless Debian Chromium driven by Playwright, around the demo model.

One server (the real app: `create_app` + `mount_ui`, UI login configured) and one signed-in browser page
serve all the tests of this module, which run in order like a user's session: sign in, generate in each
mode (streamed and not), play and download, use the voice library, read the history after a reload,
hit every error a user can cause, use the admin panel, switch the language. Screenshots of every step
are written to test-artifacts/ui/.
"""

from __future__ import annotations

import base64
import io
import itertools
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile

from browser import chromium
from conftest import PROMPT_TRANSCRIPT, REPO_ROOT, LiveServer, enrol_voice, sharing

pytestmark = pytest.mark.slow

ARTIFACTS = REPO_ROOT / "test-artifacts" / "ui"
USER, PASSWORD = "admin", "ui-test-password-1"
MAX_CHARS = 40
WAIT_MS = 120_000  # generous: the CI machine may be busy
JOB_WAIT_MS = 420_000  # a whole long-text job on a busy 2-core machine


def standin_asr(directory: Path) -> Path:
    """A stand-in transcription model (same interface as SenseVoice-Small): answers the prompt's words."""
    (directory / "standin-asr.json").write_text(
        json.dumps({"transcript": PROMPT_TRANSCRIPT}), encoding="utf-8"
    )
    return directory


@pytest.fixture(scope="module")
def ui_server(api_synthesizer, demo_model_path, tmp_path_factory):
    from cosyserve.api.app import create_app
    from cosyserve.service.assembly import Service
    from cosyserve.service.settings import Settings
    from cosyserve.ui.app import mount_ui

    settings = Settings(
        model=str(demo_model_path),
        device="cpu",
        data_dir=tmp_path_factory.mktemp("ui-data"),
        concurrency=1,
        queue_size=1,
        request_timeout_s=300.0,
        max_text_chars=MAX_CHARS,
        ui_username=USER,
        ui_password=PASSWORD,
        signing_secret="test-signing-secret-0123456789abcdef",
        asr_model=standin_asr(tmp_path_factory.mktemp("asr")),
    )
    service = Service(settings, synthesizer_factory=sharing(api_synthesizer))
    app = create_app(service)
    mount_ui(app, service)
    server = LiveServer(app, service).start()
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for earlier in ARTIFACTS.glob("[0-9][0-9]-*"):  # its own (admin-*.png: test_ui_admin_e2e)
            earlier.unlink()
        yield launched


@pytest.fixture(scope="module")
def page(browser, ui_server):
    context = browser.new_context(
        viewport={"width": 1400, "height": 1000}, locale="en-US", accept_downloads=True
    )
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    page.base_url = ui_server.url  # type: ignore[attr-defined]
    yield page
    context.close()


@pytest.fixture(autouse=True)
def screenshot_on_failure(request, page):
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        shot(page, f"failed-{request.node.name}")


_SHOTS = itertools.count(1)


def shot(page, name: str, full_page: bool = True) -> None:
    """Save a numbered screenshot (numbers follow the session's steps)."""
    page.screenshot(path=str(ARTIFACTS / f"{next(_SHOTS):02d}-{name}.png"), full_page=full_page)


def tone_wav(seconds: float, path: Path) -> Path:
    """A tone of `seconds` (too short for a prompt when under 3 s)."""
    rate = 24000
    t = np.arange(int(seconds * rate)) / rate
    soundfile.write(path, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate)
    return path


def open_tab(page, tab_id: str) -> None:
    page.get_by_role("tab", name=TAB_NAMES[tab_id]).click()


TAB_NAMES = {
    "zero_shot": "Zero-shot clone",
    "cross_lingual": "Cross-lingual",
    "instruct": "Instruct",
    "voices": "Voice library",
    "history": "History",
    "admin": "Admin",
}


def clear_prompt(page, mode: str) -> None:
    clear = page.locator(f"#{mode}-prompt button[aria-label='Clear']")
    if clear.count():
        clear.first.click()
    page.wait_for_selector(f"#{mode}-prompt input[type=file]", state="attached")
    # The cleared prompt's feedback comes back from the server: until it has, the last verdict still
    # shows and the next upload's wait would read it as its own.
    page.wait_for_function(
        f"!/dBFS|✗/.test(document.querySelector('#{mode}-feedback').innerText)", timeout=WAIT_MS
    )


def upload_prompt(page, mode: str, path: Path) -> str:
    clear_prompt(page, mode)
    page.set_input_files(f"#{mode}-prompt input[type=file]", str(path))
    page.wait_for_function(  # a verdict: measurements, or why the prompt can't be used
        f"/dBFS|✗/.test(document.querySelector('#{mode}-feedback').innerText)", timeout=WAIT_MS
    )
    return page.inner_text(f"#{mode}-feedback")


def generate(page, mode: str) -> str:
    """Click Generate and wait for the download links of the new result; returns the info text."""
    before = link_href(page, f"#{mode}-links")
    page.click(f"#{mode}-generate")
    wait_new_links(page, f"#{mode}-links", before)
    return page.inner_text(f"#{mode}-info")


def link_href(page, container: str) -> str:
    return page.evaluate(
        f"(() => {{ const a = document.querySelector('{container} a.cosy-download');"
        " return a ? a.href : ''; })()"
    )


def wait_new_links(page, container: str, before: str, timeout_ms: int = WAIT_MS) -> None:
    """Wait until `container` shows download links to another output than `before`."""
    page.wait_for_function(
        f"(before) => {{ const a = document.querySelector('{container} a.cosy-download');"
        " return a !== null && a.href !== before; }",
        arg=before,
        timeout=timeout_ms,
    )


def error_toast(page, screenshot: str | None = None) -> str:
    """The text of the newest error toast (waits for one), then closes them all."""
    toast = page.locator(".toast-body").last
    toast.wait_for(timeout=WAIT_MS)
    message = toast.inner_text()
    if screenshot:
        page.wait_for_timeout(400)  # let the toast finish fading in
        shot(page, screenshot, full_page=False)  # the viewport: the toast is fixed on top of it
    for close in page.locator(".toast-close").all():
        if close.is_visible():
            close.click()
    # Closed toasts fade out before they leave the page; wait for that, or a slow machine reads this
    # toast again as the "newest" one after the next action.
    page.wait_for_function("document.querySelectorAll('.toast-body').length === 0", timeout=WAIT_MS)
    return message


def download(page, selector: str, name: str) -> bytes:
    with page.expect_download() as info:
        page.click(selector)
    target = ARTIFACTS / name
    info.value.save_as(target)
    return target.read_bytes()


def no_traceback(page) -> None:
    body = page.inner_text("body")
    assert "Traceback" not in body and 'File "' not in body, body[-2000:]


# ---- the session, in order --------------------------------------------------------------------------


def test_login(page):
    base = page.base_url
    page.goto(base + "/")
    assert "/login" in page.url  # the page itself needs a login
    shot(page, "login")
    page.fill("#username", USER)
    page.fill("#password", "wrong password")
    page.click("#login-submit")
    assert page.locator("#login-error").is_visible()
    page.fill("#username", USER)
    page.fill("#password", PASSWORD)
    page.click("#login-submit")
    page.wait_for_selector("#zero_shot-generate")
    page.locator("#cosy-demo-banner").wait_for()
    page.wait_for_function("document.querySelector('#cosy-demo-banner').innerText.includes('demo model')")
    page.wait_for_function("document.querySelector('#cosy-status').innerText.includes('ready')")
    assert "Signed in as admin" in page.inner_text("#cosy-user")
    shot(page, "signed-in")


def test_zero_shot_streamed(page, shared_dir):
    feedback = upload_prompt(page, "zero_shot", shared_dir / "audio" / "prompt_zh_24k.wav")
    assert "usable" in feedback and "dBFS" in feedback, feedback
    page.fill("#zero_shot-transcript textarea", PROMPT_TRANSCRIPT)
    page.fill("#zero_shot-text textarea", "你好。")
    assert "3 / 40" in page.inner_text("#zero_shot-counter")
    page.fill("#zero_shot-seed textarea, #zero_shot-seed input", "7")
    assert page.is_checked("#zero_shot-stream input")
    info = generate(page, "zero_shot")
    assert "Seed 7" in info, info
    stats = page.evaluate("Object.values(window.cosyStream.stats).pop()")
    # Streamed: audio reached the Web Audio player, and it started before the run ended.
    assert stats["chunks"] >= 1 and stats["samples"] > 0, stats
    assert stats["firstChunkAt"] is not None and stats["endedAt"] is not None
    assert stats["firstChunkAt"] <= stats["endedAt"], stats
    shot(page, "zero-shot-streamed")
    play_result(page, "zero_shot")
    data = download(page, "#zero_shot-links a[data-format=wav]", "zero_shot.wav")
    audio, rate = soundfile.read(io.BytesIO(data))
    assert rate == 24000 and len(audio) == stats["samples"]  # the stored file is what was streamed


def play_result(page, mode: str, attempts: int = 3) -> None:
    """Press play on the result player; the browser must load and start the stored file. A player that
    was replaced just as it was clicked (a job's final file taking the place of its pieces) is clicked
    again."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    result = page.locator(f"#{mode}-result")
    for attempt in range(attempts):
        result.locator("button[aria-label='Play'], button[aria-label='play']").first.click()
        try:
            page.wait_for_function(
                """(mode) => {
                    const el = document.querySelector(`#${mode}-result`);
                    const pause = el.querySelector("button[aria-label='Pause'], button[aria-label='pause']");
                    const time = el.querySelector('#time');
                    return pause !== null || (time && time.innerText !== '0:00');
                }""",
                arg=mode,
                timeout=20_000,
            )
            return
        except PlaywrightTimeout:
            if attempt == attempts - 1:
                raise


def test_cross_lingual_not_streamed_mp3(page, shared_dir):
    open_tab(page, "cross_lingual")
    feedback = upload_prompt(page, "cross_lingual", shared_dir / "audio" / "prompt_zh_24k.wav")
    assert "usable" in feedback
    page.fill("#cross_lingual-text textarea", "Hello there.")
    assert page.is_checked("#cross_lingual-stream input")  # left on: more than 1 take is not streamed
    page.fill("#cross_lingual-takes input[type=number]", "2")  # the demo model's noise fails: 2 takes
    page.press("#cross_lingual-takes input[type=number]", "Tab")
    page.click("#cross_lingual-dice")
    page.wait_for_function(
        "(() => { const el = document.querySelector("
        "'#cross_lingual-seed textarea, #cross_lingual-seed input');"
        " return el && /^[0-9]+$/.test(el.value); })()"
    )
    info = generate(page, "cross_lingual")
    assert "Seed" in info and "2 takes" in info
    shot(page, "cross-lingual")
    data = download(page, "#cross_lingual-links a[data-format=mp3]", "cross_lingual.mp3")
    assert data[:3] == b"ID3" or data[0] == 0xFF, data[:8]


def test_instruct(page, shared_dir):
    open_tab(page, "instruct")
    upload_prompt(page, "instruct", shared_dir / "audio" / "prompt_zh_24k.wav")
    page.fill("#instruct-instruct textarea, #instruct-instruct input", "请用四川话表达。")
    page.fill("#instruct-text textarea", "今天天气不错。")
    info = generate(page, "instruct")
    assert "Seed" in info
    shot(page, "instruct")
    data = download(page, "#instruct-links a[data-format=wav]", "instruct.wav")
    assert data[:4] == b"RIFF"


def test_voice_library(page, shared_dir):
    open_tab(page, "voices")
    page.fill("#enrol-name textarea, #enrol-name input", "alice")
    page.set_input_files("#enrol-audio input[type=file]", str(shared_dir / "audio" / "prompt_zh_24k.wav"))
    page.fill("#enrol-transcript textarea", PROMPT_TRANSCRIPT)
    page.click("#enrol-submit")
    page.wait_for_function("document.querySelector('#voices-status').innerText.includes('alice')")
    assert "alice" in page.inner_text("#voices-table")
    shot(page, "voice-enrolled")
    # preview the original recording (alice is picked after enrolment)
    page.click("#voices-preview")
    page.wait_for_selector("#voices-preview-audio [data-testid='download-link']")
    page.fill("#voices-new-name textarea, #voices-new-name input", "bob")
    page.click("#voices-rename")
    page.wait_for_function("document.querySelector('#voices-status').innerText.includes('bob')")
    assert "bob" in page.inner_text("#voices-table")
    page.click("#voices-use")
    page.wait_for_function("document.querySelector('#zero_shot-voice input').value === 'bob'")
    page.fill("#zero_shot-text textarea", "用保存的音色。")
    page.fill("#zero_shot-seed textarea, #zero_shot-seed input", "11")
    info = generate(page, "zero_shot")
    assert "Seed 11" in info
    shot(page, "saved-voice-result")


def test_history_survives_reload_and_reruns(page):
    page.reload()
    page.wait_for_selector("#zero_shot-generate")
    open_tab(page, "history")
    table = page.locator("#history-table")
    page.wait_for_function("document.querySelector('#history-table').innerText.includes('用保存的音色')")
    text = table.inner_text()
    for words in ("你好。", "Hello there.", "今天天气不错。", "用保存的音色。"):
        assert words in text, text
    # the newest entry (saved voice bob, seed 11) is shown with its audio, links and parameters
    page.wait_for_selector("#history-links a.cosy-download")
    assert '"seed": 11' in page.inner_text("#history-params").replace("\n", "") or "11" in page.inner_text(
        "#history-params"
    )
    shot(page, "history")
    data = download(page, "#history-links a[data-format=flac]", "history.flac")
    assert data[:4] == b"fLaC"
    rows = "Number(document.querySelector('#history-table [role=grid]').getAttribute('aria-rowcount'))"
    count_before = page.evaluate(rows)
    page.click("#history-rerun")  # a saved voice: runs again at once, in the zero-shot tab
    page.wait_for_function(f"(n) => {rows} > n", arg=count_before)
    assert "Seed 11" in page.inner_text("#zero_shot-info")
    shot(page, "rerun")


def choose(page, elem_id: str, label: str) -> None:
    """Pick `label` in a Gradio dropdown."""
    page.click(f"#{elem_id} input")
    page.locator("[data-testid='dropdown-option']", has_text=label).first.click()


def newest_output(service):
    return service.outputs.list(limit=1)[0]


def test_saved_voice_locks_the_recording_fields(page, ui_server, shared_dir):
    """Bug 1: with a saved voice the upload and transcript are off and the page says which transcript is
    used; an unrelated transcript can't reach the manifest, and Cross-lingual takes no upload."""
    open_tab(page, "zero_shot")
    page.wait_for_function("document.querySelector('#zero_shot-voice input').value === 'bob'")
    note = page.locator("#zero_shot-voice-note")
    note.wait_for()
    page.wait_for_function("document.querySelector('#zero_shot-voice-note').innerText.includes('bob')")
    assert PROMPT_TRANSCRIPT in note.inner_text()
    transcript = page.locator("#zero_shot-transcript textarea")
    assert transcript.is_disabled() and transcript.input_value() == PROMPT_TRANSCRIPT
    assert page.locator("#zero_shot-prompt input[type=file]").count() == 0
    shot(page, "saved-voice-locks-fields", full_page=False)
    page.fill("#zero_shot-text textarea", "周末我们一起去[重庆][chóng qìng]吃火锅吧")
    generate(page, "zero_shot")
    manifest = newest_output(ui_server.service).manifest
    voice = ui_server.service.voices.get("bob")
    assert manifest["voice"] == voice.id and manifest["prompt_text"] in (None, voice.transcript), manifest
    # Bug 2: the subtitles show what was written, not the LM's tokens.
    href = page.get_attribute("#zero_shot-links a[data-format=srt]", "href")
    srt = base64.b64decode(href.split("base64,", 1)[1]).decode("utf-8")
    assert "重庆" in srt and "[ch]" not in srt, srt
    open_tab(page, "cross_lingual")  # after "Use for synthesis" the 1 s tone could still be uploaded
    choose(page, "cross_lingual-voice", "bob")
    page.wait_for_function("document.querySelector('#cross_lingual-voice-note').innerText.includes('bob')")
    assert page.locator("#cross_lingual-prompt input[type=file]").count() == 0
    for mode in ("cross_lingual", "zero_shot"):  # back to recordings for the next steps
        open_tab(page, mode)
        choose(page, f"{mode}-voice", "(none")
        page.wait_for_selector(f"#{mode}-prompt input[type=file]", state="attached")
        assert not page.locator(f"#{mode}-voice-note").inner_text().strip()


def test_a_users_transcript_is_shown_as_written_to_the_admin(page, ui_server, prompt_wav_bytes):
    """A transcript holding a web address right before a tag (`http://a.b/x<img src=…>`) became a live
    image and link in the admin's studio note: the address took in the backslash that escaped the tag."""
    _, key = ui_server.service.keys.create("mallory", role="user")
    hostile = (
        "http://a.b/x<img id=pwn src=http://127.0.0.1:9/p.png> http://a.b/x<a id=phish href=http://evil.example>"
        "CLICK</a> ![t](http://127.0.0.1:9/t.png) <input id=field>"
    )
    with ui_server.client(headers={"Authorization": f"Bearer {key}"}) as client:
        enrol_voice(client, "mallory", prompt_wav_bytes, transcript=hostile)  # the admin sees every voice
    page.reload()
    open_tab(page, "zero_shot")
    choose(page, "zero_shot-voice", "mallory")
    try:
        page.wait_for_function(
            "document.querySelector('#zero_shot-voice-note').innerText.includes('mallory')"
        )
        note = page.locator("#zero_shot-voice-note")
        assert note.locator("img, a, input").count() == 0, note.inner_html()
        assert "<img id=pwn" in note.inner_text() and "<input id=field>" in note.inner_text()
    finally:  # the next tests use a recording
        choose(page, "zero_shot-voice", "(none")


def test_help_example_follows_the_official_convention(page):
    """Bug 3: the pinyin replaces the character: 爱[h][ào], not 爱好[h][ào]."""
    open_tab(page, "zero_shot")
    page.click("#zero_shot-help button, #zero_shot-help .label-wrap")
    page.wait_for_function("document.querySelector('#zero_shot-help').innerText.includes('[h][ào]')")
    help_text = page.inner_text("#zero_shot-help")
    assert "爱[h][ào]" in help_text and "爱好[h][ào]" not in help_text, help_text


def test_text_preview(page, shared_dir):
    """The preview: spoken form of numbers, a whole-word pronunciation highlighted, an English word."""
    open_tab(page, "zero_shot")
    page.fill("#zero_shot-transcript textarea", PROMPT_TRANSCRIPT)
    page.fill("#zero_shot-text textarea", "我花了12.5元去[重庆][chóng qìng]买iPhone。")
    page.click("#zero_shot-preview-btn")
    page.wait_for_function("document.querySelector('#zero_shot-preview').innerText.includes('iPhone')")
    preview = page.inner_text("#zero_shot-preview")
    assert "十二点五元" in preview and "iPhone" in preview, preview
    assert "[ch]" in page.inner_text("#zero_shot-preview mark.cosy-pron >> nth=0")
    shot(page, "text-preview")


def test_transcribe_fills_the_transcript(page, shared_dir):
    """The stand-in ASR (same interface as SenseVoice-Small) fills the transcript box."""
    open_tab(page, "zero_shot")
    upload_prompt(page, "zero_shot", shared_dir / "audio" / "prompt_zh_24k.wav")
    page.fill("#zero_shot-transcript textarea", "")
    page.click("#zero_shot-transcribe")
    page.wait_for_function(
        "(t) => document.querySelector('#zero_shot-transcript textarea').value === t", arg=PROMPT_TRANSCRIPT
    )


def test_noisy_prompt_warns_and_denoises(page, shared_dir, tmp_path):
    samples, rate = soundfile.read(shared_dir / "audio" / "prompt_zh_24k.wav", dtype="float32")
    noise = np.random.default_rng(0).standard_normal(len(samples)).astype(np.float32)
    noisy = samples + noise * float(np.sqrt(np.mean(samples**2))) * 10 ** (-10 / 20)
    soundfile.write(tmp_path / "noisy.wav", np.clip(noisy, -1, 1), rate)
    open_tab(page, "cross_lingual")
    feedback = upload_prompt(page, "cross_lingual", tmp_path / "noisy.wav")
    assert "noisy recording" in feedback and "SNR about" in feedback, feedback
    page.check("#cross_lingual-denoise input")
    page.wait_for_selector(
        "#cross_lingual-denoised audio, #cross_lingual-denoised [data-testid='download-link']"
    )
    shot(page, "noisy-prompt-denoise")
    page.uncheck("#cross_lingual-denoise input")


def test_quiet_prompt_is_called_too_quiet(page, shared_dir, tmp_path):
    """Bug 6: a quiet prompt is refused as too quiet, not as too short."""
    samples, rate = soundfile.read(shared_dir / "audio" / "prompt_zh_24k.wav", dtype="float32")
    soundfile.write(tmp_path / "quiet.wav", samples / np.abs(samples).max() * 10 ** (-50 / 20), rate)
    feedback = upload_prompt(page, "cross_lingual", tmp_path / "quiet.wav")
    assert "too quiet" in feedback and "long" not in feedback, feedback


def test_instruct_paraphrase_shows_the_trained_wording(page):
    """Bug 7: 请用四川话说 is sent as the preset's wording, and the page says so."""
    open_tab(page, "instruct")
    page.fill("#instruct-instruct textarea, #instruct-instruct input", "请用四川话说")
    page.wait_for_function(
        "document.querySelector('#instruct-instruct-note').innerText.includes('请用四川话表达。')"
    )


def test_error_clears_the_last_result_and_shows_one_badge(page, shared_dir):
    """Bug 4: after an error nothing of the previous result stays, under at most one Error badge."""
    open_tab(page, "cross_lingual")
    upload_prompt(page, "cross_lingual", shared_dir / "audio" / "prompt_zh_24k.wav")
    page.fill("#cross_lingual-text textarea", "Hello.")
    generate(page, "cross_lingual")
    page.fill("#cross_lingual-text textarea", "   ")
    page.click("#cross_lingual-generate")
    error_toast(page)
    page.wait_for_function("document.querySelector('#cross_lingual-links a') === null")
    assert page.locator("#cross_lingual-result [data-testid='download-link']").count() == 0
    badges = page.evaluate(
        "Array.from(document.querySelectorAll('#tab-cross_lingual *')).filter(e => e.children.length === 0"
        " && e.innerText && e.innerText.trim() === 'Error' && e.offsetParent !== null).length"
    )
    assert badges <= 1, badges
    shot(page, "error-after-result")


def test_voice_preview_is_listed_as_preview_and_history_fits(page):
    open_tab(page, "voices")
    choose(page, "voices-pick", "bob")
    page.fill("#voices-preview-text textarea, #voices-preview-text input", "试听一下。")
    page.click("#voices-preview")
    page.wait_for_selector("#voices-preview-audio [data-testid='download-link']")
    open_tab(page, "history")
    page.click("#history-refresh")
    page.wait_for_function("document.querySelector('#history-table').innerText.includes('试听一下')")
    row = page.evaluate(
        "Array.from(document.querySelectorAll('#history-table [role=row], #history-table tr'))"
        ".map(r => r.innerText).find(t => t.includes('试听一下')) || ''"
    )
    assert "preview" in row and "API" not in row, row
    fits = page.evaluate(
        "(() => { const t = document.querySelector('#history-table');"
        " const cells = t.querySelectorAll('[role=columnheader], th');"
        " const last = cells[cells.length - 1].getBoundingClientRect();"
        " return last.right <= t.getBoundingClientRect().right + 1 && last.width > 40; })()"
    )
    assert fits, "the id column is cut off"


def held_until_the_cancel(monkeypatch, owner, name: str, cancelling) -> tuple[threading.Event, list]:
    """`owner.name` patched to wait, once called, until `cancelling.cancel` has run (events, not sleeps:
    the same order on a fast or a busy machine); returns (called, what the calls returned)."""
    original, original_cancel = getattr(owner, name), cancelling.cancel
    called, cancel_arrived, results = threading.Event(), threading.Event(), []

    def held(*args, **kwargs):
        called.set()
        assert cancel_arrived.wait(WAIT_MS / 1000), "the Cancel did not reach the server"
        results.append(original(*args, **kwargs))
        return results[-1]

    def noted_cancel(*args, **kwargs):
        count = original_cancel(*args, **kwargs)
        cancel_arrived.set()
        return count

    monkeypatch.setattr(owner, name, held)
    monkeypatch.setattr(cancelling, "cancel", noted_cancel)
    return called, results


def test_cancel_before_the_ticket_exists_cancels_it(page, ui_server, monkeypatch):
    """Bug 5: a Cancel that arrives while the request is still being submitted (as after an engine restart)
    used to say "Cancelled." while the result was made and saved anyway."""
    from cosyserve.ui.bridge import UiBridge
    from cosyserve.ui.generate import Run

    # The submission is slow: it ends only after the Cancel has reached the server, before the ticket exists.
    submitting, tickets = held_until_the_cancel(monkeypatch, UiBridge, "submit", Run)
    before = len(ui_server.service.outputs.list(limit=500))
    open_tab(page, "cross_lingual")
    page.uncheck("#cross_lingual-stream input")
    page.fill("#cross_lingual-text textarea", "Cancel me.")
    page.click("#cross_lingual-generate")
    assert submitting.wait(WAIT_MS / 1000)
    page.click("#cross_lingual-cancel")
    page.wait_for_function("document.querySelector('#cross_lingual-info').innerText.includes('Cancelled')")
    # The ticket made after the Cancel has ended: a synthesis that was not really cancelled is saved by now.
    assert len(tickets) == 1 and tickets[0].wait(WAIT_MS / 1000)
    assert tickets[0].state == "cancelled", tickets[0]
    assert len(ui_server.service.outputs.list(limit=500)) == before
    assert "Cancelled" in page.inner_text("#cross_lingual-info")


def test_cancel_while_the_click_waits_in_the_pages_queue(page, ui_server, monkeypatch):
    """A Cancel pressed while the Generate click still waits in the page's queue (every synthesis slot of
    the page busy: its handler has not started) used to be lost, and the synthesis ran once the click's
    turn came. Now the page names the click by a token, and the click ends cancelled as it starts."""
    from cosyserve.ui.bridge import UiBridge
    from cosyserve.ui.generate import TicketRegistry

    # The handler starts only after the Cancel has reached the server, as for a click that waited.
    waiting, runs = held_until_the_cancel(monkeypatch, TicketRegistry, "begin", TicketRegistry)
    submitted: list = []
    monkeypatch.setattr(UiBridge, "submit", lambda *args, **kwargs: submitted.append(args))
    open_tab(page, "cross_lingual")
    page.uncheck("#cross_lingual-stream input")
    page.fill("#cross_lingual-text textarea", "Cancel me while I wait.")
    page.click("#cross_lingual-generate")
    assert waiting.wait(WAIT_MS / 1000)
    page.click("#cross_lingual-cancel")
    page.wait_for_function("document.querySelector('#cross_lingual-info').innerText.includes('Cancelled')")
    assert len(runs) == 1 and runs[0].click and runs[0].cancelled, runs
    assert submitted == []  # nothing was synthesised
    monkeypatch.undo()  # the next click of the tab is a new one, not cancelled
    page.fill("#cross_lingual-text textarea", "Hi.")
    page.click("#cross_lingual-generate")
    page.wait_for_function("document.querySelector('#cross_lingual-info').innerText.includes('Seed')")


def long_text(chars: int) -> str:
    sentence = "今天天气很好，我们一起去公园散步，看看湖边的花。"
    text = (sentence * (chars // len(sentence) + 1))[: chars - 1] + "。"
    assert len(text) == chars
    return text


def test_long_text_becomes_a_job_with_progress(page, ui_server, shared_dir):
    """A 240-character text (6 times what one synthesis takes here, 10 sentences): a job with a visible,
    advancing progress bar, the first pieces playable before the end, then the audio and an SRT link."""
    open_tab(page, "cross_lingual")
    upload_prompt(page, "cross_lingual", shared_dir / "audio" / "prompt_zh_24k.wav")
    page.fill("#cross_lingual-text textarea", long_text(240))
    assert "job" in page.inner_text("#cross_lingual-counter")
    before = link_href(page, "#cross_lingual-links")
    page.click("#cross_lingual-generate")
    page.wait_for_selector("#cross_lingual-progress .cosy-progress")
    fraction = "Number(document.querySelector('#cross_lingual-progress .cosy-progress').dataset.fraction)"
    page.wait_for_function(
        f"document.querySelector('#cross_lingual-progress .cosy-progress') && {fraction} > 0"
    )
    first = page.evaluate(fraction)
    line = page.inner_text("#cross_lingual-progress")
    assert "sentences" in line and "elapsed" in line and "left" in line, line
    page.wait_for_selector("#cross_lingual-result audio, #cross_lingual-result [data-testid='download-link']")
    partial_at = page.evaluate(fraction)
    assert partial_at < 1.0  # the finished pieces play while the rest is made
    shot(page, "long-text-progress", full_page=False)
    page.wait_for_function(
        "(f) => { const p = document.querySelector('#cross_lingual-progress .cosy-progress');"
        " return p && Number(p.dataset.fraction) > f; }",
        arg=first,
        timeout=300_000,
    )
    wait_new_links(page, "#cross_lingual-links", before, timeout_ms=JOB_WAIT_MS)
    page.wait_for_selector("#cross_lingual-links a[data-format=srt]", timeout=JOB_WAIT_MS)
    href = page.get_attribute("#cross_lingual-links a[data-format=srt]", "href")
    srt = base64.b64decode(href.split("base64,", 1)[1]).decode("utf-8")
    assert srt.count(" --> ") >= 5, srt[:300]  # 10 sentences
    # the preview lists the sentences the job spoke, with the subtitles' times (each piece is split on
    # its own, so they are not the whole text's sentences)
    page.wait_for_selector("#cross_lingual-preview .cosy-sentences[data-from=result]")
    rows = page.locator("#cross_lingual-preview .cosy-sentences li").all_inner_texts()
    assert len(rows) == srt.count(" --> "), (rows, srt[:300])
    play_result(page, "cross_lingual")
    shot(page, "long-text-done")
    record = ui_server.service.jobs.list(limit=1)[0]
    assert record.state == "done" and record.output_id


def test_a_cancelled_long_text_offers_what_it_made(page, ui_server):
    """Cancel once the first pieces play: the job stops, and the page offers what was made (the player and
    every download link) and says which part is missing; it used to say only "Cancelled."."""
    open_tab(page, "cross_lingual")
    page.uncheck("#cross_lingual-stream input")  # a streaming player would be an <audio> from the start
    # 15 pieces: some are left to cancel, on a busy CI machine too
    page.fill("#cross_lingual-text textarea", long_text(600))
    before = link_href(page, "#cross_lingual-links")
    earlier = {record.id for record in ui_server.service.jobs.list(limit=50)}
    page.click("#cross_lingual-generate")
    # cancel once this job has made a piece (an earlier result's player satisfied a wait on the page, so
    # the cancel sometimes came before any piece was made, and there was nothing to keep)
    deadline = time.monotonic() + JOB_WAIT_MS / 1000
    while not any(r.id not in earlier and r.progress > 0 for r in ui_server.service.jobs.list(limit=5)):
        assert time.monotonic() < deadline, "the job made no piece"
        time.sleep(0.05)
    page.click("#cross_lingual-cancel")
    page.wait_for_function(
        "document.querySelector('#cross_lingual-info').innerText.includes('What was made is kept')",
        timeout=JOB_WAIT_MS,
    )
    info = page.inner_text("#cross_lingual-info")
    assert info.startswith("Cancelled.") and "missing from part" in info, info
    wait_new_links(page, "#cross_lingual-links", before, timeout_ms=JOB_WAIT_MS)
    record = ui_server.service.jobs.list(limit=1)[0]
    partial = record.result_extra["partial"]
    assert record.state == "cancelled" and record.output_id, record
    assert f"{partial['segments_done']} of {partial['segments_total']} parts" in info, (info, partial)
    assert record.output_id in link_href(page, "#cross_lingual-links")
    assert page.inner_text("#cross_lingual-progress") == ""  # no bar left standing
    shot(page, "long-text-cancelled")


def test_errors_are_readable(page, ui_server, shared_dir, tmp_path):
    open_tab(page, "cross_lingual")
    clear_prompt(page, "cross_lingual")
    page.fill("#cross_lingual-text textarea", "Hi.")
    page.click("#cross_lingual-generate")
    assert "No voice prompt" in error_toast(page, "error-no-prompt")

    feedback = upload_prompt(page, "cross_lingual", tone_wav(1.0, tmp_path / "one_second.wav"))
    assert "can't be used" in feedback and "only 1.0 s" in feedback, feedback
    page.click("#cross_lingual-generate")
    assert "only 1.0 s" in error_toast(page, "error-short-prompt")

    upload_prompt(page, "cross_lingual", shared_dir / "audio" / "prompt_zh_24k.wav")
    too_long = MAX_CHARS * 50 + 5  # over what even a job takes
    page.fill("#cross_lingual-text textarea", "字" * too_long)
    assert "over" in page.get_attribute("#cross_lingual-counter .cosy-counter", "class")
    page.click("#cross_lingual-generate")
    message = error_toast(page, "error-too-long")
    assert f"{too_long} characters" in message and f"job limit of {MAX_CHARS * 50}" in message, message

    release = threading.Event()
    blockers = fill_queue(ui_server.service, release)
    try:
        page.fill("#cross_lingual-text textarea", "Hi.")
        page.click("#cross_lingual-generate")
        assert "queue is full" in error_toast(page, "error-queue-full")
    finally:
        release.set()
        for ticket in blockers:
            ticket.wait(30)
    no_traceback(page)


def fill_queue(service, release: threading.Event) -> list:
    """Occupy every worker and waiting place of the scheduler until `release` is set."""
    from cosyserve.errors import QueueFull

    tickets = []
    scheduler = service.scheduler
    for n in range(scheduler.concurrency + 2 * scheduler.queue_size + 2):  # a key's first place included
        try:
            tickets.append(scheduler.submit(lambda ctx: release.wait(60), owner=f"key:filler-{n}"))
        except QueueFull:
            break
    return tickets


def test_cancel(page, ui_server):
    release = threading.Event()
    service = ui_server.service
    blocker = service.scheduler.submit(lambda ctx: release.wait(60))  # the UI's job waits behind it
    try:
        page.check("#cross_lingual-stream input")  # (the default) a stream says its place in the queue too
        page.fill("#cross_lingual-text textarea", "Hi.")
        page.click("#cross_lingual-generate")
        wait_until(lambda: service.scheduler.stats()["queued"] >= 1)  # the UI's request waits in the queue
        page.wait_for_function(
            "document.querySelector('#cross_lingual-info').innerText.includes('Next in line: starts in')"
        )
        page.click("#cross_lingual-cancel")
        page.wait_for_function(
            "document.querySelector('#cross_lingual-info').innerText.includes('Cancelled')"
        )
        shot(page, "cancelled")
    finally:
        release.set()
        blocker.wait(30)
    no_traceback(page)


def wait_until(condition, timeout_s: float = WAIT_MS / 1000) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_admin_panel(page, ui_server):
    open_tab(page, "admin")
    page.wait_for_function("document.querySelector('#admin-status').innerText.includes('Queue')")
    status = page.inner_text("#admin-status")
    assert "ready" in status and "running" in status, status
    page.wait_for_function("document.querySelector('#admin-logs').innerText.length > 0")
    assert "No GPU to show" in page.inner_text("#admin-gpus")  # no GPU here: said so, not an error
    page.wait_for_function("document.querySelector('#admin-activity').innerText.includes('synthesis')")
    activity = page.inner_text("#admin-activity")
    assert "admin" in activity and "ok" in activity, activity  # what ran, for whom, how it ended
    shot(page, "admin")
    page.click("#admin-restart")  # asks first
    page.locator("#admin-confirm").wait_for()
    assert "Restart now?" in page.inner_text("#admin-message")
    page.click("#admin-keep")
    page.locator("#admin-confirm").wait_for(state="hidden")
    assert ui_server.service.readiness()["state"] == "ready"
    page.click("#admin-restart")
    page.click("#admin-confirm")
    # The panel follows the reload by itself until the engine settles (no refresh needed).
    page.wait_for_function("document.querySelector('#admin-message').innerText.includes('Restart finished')")
    ui_server.wait_ready()
    page.wait_for_function("document.querySelector('#admin-status').innerText.includes('ready')")
    shot(page, "admin-restarted")


def test_api_key_user(browser, ui_server, shared_dir):
    """A user-role API key signs in too (same credentials as the API), sees no admin panel, clones a
    recording and enrols its own voice only after confirming consent, sees no transcript of others'
    voices, and its history holds only its own results."""
    _, plaintext = ui_server.service.keys.create("ui-user", role="user")
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, locale="en-US")
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    try:
        page.goto(ui_server.url + "/")
        page.locator("#login-submit").wait_for()
        page.click("details summary")
        page.fill("#api_key", plaintext)
        page.click("#login-submit")
        page.wait_for_selector("#zero_shot-generate")
        page.wait_for_function("document.querySelector('#cosy-user').innerText.includes('ui-user')")
        assert page.get_by_role("tab", name="Admin").count() == 0
        open_tab(page, "history")
        page.wait_for_timeout(1000)
        assert "你好。" not in page.inner_text("#history-table")  # the admin's results are not listed
        open_tab(page, "zero_shot")
        upload_prompt(page, "zero_shot", shared_dir / "audio" / "prompt_zh_24k.wav")
        page.fill("#zero_shot-transcript textarea", PROMPT_TRANSCRIPT)
        page.fill("#zero_shot-text textarea", "钥匙用户。")
        page.click("#zero_shot-generate")  # a user key cloning a recording needs the consent box
        assert "consent" in error_toast(page, "user-key-recording-needs-consent").lower()
        page.check("#zero_shot-consent input")
        generate(page, "zero_shot")
        open_tab(page, "history")
        page.wait_for_function("document.querySelector('#history-table').innerText.includes('钥匙用户')")
        open_tab(page, "voices")
        page.fill("#enrol-name textarea, #enrol-name input", "carol")
        page.set_input_files("#enrol-audio input[type=file]", str(shared_dir / "audio" / "prompt_zh_24k.wav"))
        page.click("#enrol-submit")
        assert "consent" in error_toast(page, "user-key-needs-consent").lower()
        page.check("#enrol-consent input")
        page.click("#enrol-submit")  # a user key enrols its own voice, with consent, like the API
        page.wait_for_function("document.querySelector('#voices-status').innerText.includes('carol')")
        table = page.inner_text("#voices-table")
        assert "carol" in table and "yours" in table and "ui-user" in table  # its own, consent by it
        assert PROMPT_TRANSCRIPT not in table  # the shared voice of the admin: no transcript
        shot(page, "user-key-own-voice")
        no_traceback(page)
    finally:
        context.close()


def test_language_switch(page):
    page.click("#cosy-lang label:has-text('中文')")
    page.get_by_role("tab", name="3秒极速复刻").wait_for()
    page.get_by_role("tab", name="跨语种复刻").wait_for()
    page.get_by_role("tab", name="自然语言控制").wait_for()
    shot(page, "chinese")
    page.reload()  # the choice is remembered by the browser
    page.get_by_role("tab", name="3秒极速复刻").wait_for()
    page.click("#cosy-lang label:has-text('English')")
    page.get_by_role("tab", name="Zero-shot clone").wait_for()
    no_traceback(page)


TAB_IDS = ("zero_shot", "cross_lingual", "instruct", "voices", "admin", "history")
ZH_TAB_NAMES = {
    "zero_shot": "3秒极速复刻",
    "cross_lingual": "跨语种复刻",
    "instruct": "自然语言控制",
    "voices": "音色库",
    "history": "历史记录",
    "admin": "管理",
}


SHOWN_TAB_OR_MENU = """(name) => {
    const shown = (el) => el !== null && el.getClientRects().length > 0
        && getComputedStyle(el).visibility !== 'hidden';
    const tabs = [...document.querySelectorAll('[role=tab]')];
    if (tabs.some((b) => b.textContent.includes(name) && shown(b))) return 'tab';
    return shown(document.querySelector('.overflow-menu button, button.overflow-menu')) ? 'menu' : null;
}"""  # 'tab': the tab's button is in the bar; 'menu': Gradio's "More tabs" button is; null: neither yet


def show_tab(page, tab_id: str, lang: str) -> None:
    """Open a tab by its name, through Gradio's overflow menu when the window is too narrow for all."""
    name = (ZH_TAB_NAMES if lang == "zh" else TAB_NAMES)[tab_id]
    # Which way is open now (no fixed wait for a tab that a narrow window never shows).
    where = page.wait_for_function(SHOWN_TAB_OR_MENU, arg=name).json_value()
    if where == "tab":
        page.get_by_role("tab", name=name).first.click()
    else:  # a narrow window: the tab is in Gradio's "More tabs" menu
        page.locator(".overflow-menu button, button.overflow-menu").first.click()
        page.locator(
            ".overflow-dropdown button, .overflow-item-container button", has_text=name
        ).first.click()
    page.locator(f"#tab-{tab_id}").wait_for(state="visible")
    next_frames(page)


def next_frames(page) -> None:
    """Wait until the browser has drawn two more frames: what was just shown is laid out and painted."""
    page.evaluate("() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")


def wait_language(page, lang: str) -> None:
    """Wait until the tab buttons carry `lang`'s names (in the tab bar or its overflow menu)."""
    name = (ZH_TAB_NAMES if lang == "zh" else TAB_NAMES)["zero_shot"]
    page.wait_for_function(
        "(name) => [...document.querySelectorAll('[role=tab], button')]"
        ".some(b => b.textContent.includes(name))",
        arg=name,
    )
    next_frames(page)


@pytest.mark.parametrize("viewport", [(1400, 1000), (390, 844)], ids=["desktop", "phone"])
def test_screenshots_of_every_tab(page, viewport):
    """Every tab in both languages at both sizes, written to test-artifacts/ui/; nothing runs wider than
    the window."""
    width, height = viewport
    page.set_viewport_size({"width": width, "height": height})
    try:
        for lang, label in (("en", "English"), ("zh", "中文")):
            page.click(f"#cosy-lang label:has-text('{label}')")
            wait_language(page, lang)
            for tab_id in TAB_IDS:
                show_tab(page, tab_id, lang)
                overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
                assert overflow <= 1, f"{tab_id} ({lang}, {width}px) is {overflow}px wider than the window"
                if tab_id == "history":  # on a phone its columns wrapped one letter a line; now it scrolls
                    # the header's cells, and the body's (a virtual list Gradio sized apart, half as wide)
                    widths = page.evaluate(
                        "['#history-table th', '#history-table [role=gridcell]'].map(cells =>"
                        " [...document.querySelectorAll(cells)].map(c => c.getBoundingClientRect().width))"
                    )
                    narrowest = min(min(cells) for cells in widths if cells)
                    assert narrowest >= 40, f"history columns of {narrowest:.0f}px at {width}px"
                    header, body = widths
                    if body:  # each body cell as wide as its column's header
                        row = body[: len(header)]
                        assert all(abs(a - b) <= 1 for a, b in zip(header, row, strict=True)), (header, row)
                shot(page, f"tab-{tab_id}-{lang}-{width}x{height}")
    finally:
        page.click("#cosy-lang label:has-text('English')")
        page.set_viewport_size({"width": 1400, "height": 1000})
