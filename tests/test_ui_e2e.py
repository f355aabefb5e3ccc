"""The web UI end to end, in headless Debian Chromium driven by Playwright, around the demo model.

One server (the real app: `create_app` + `mount_ui`, UI login configured) and one signed-in browser page
serve all the tests of this module, which run in order like a user's session: sign in, generate in each
mode (streamed and not), play and download, use the voice library, read the history after a reload,
hit every error a user can cause, use the admin panel, switch the language. Screenshots of every step
are written to test-artifacts/ui/.
"""

from __future__ import annotations

import io
import itertools
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile

from browser import chromium
from conftest import PROMPT_TRANSCRIPT, REPO_ROOT, LiveServer, sharing

pytestmark = pytest.mark.slow

ARTIFACTS = REPO_ROOT / "test-artifacts" / "ui"
USER, PASSWORD = "admin", "ui-test-password-1"
MAX_CHARS = 40
WAIT_MS = 120_000  # generous: the CI machine may be busy


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
        shutil.rmtree(ARTIFACTS, ignore_errors=True)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
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


def upload_prompt(page, mode: str, path: Path) -> str:
    clear_prompt(page, mode)
    page.set_input_files(f"#{mode}-prompt input[type=file]", str(path))
    page.wait_for_function(  # a verdict: measurements, or why the prompt can't be used
        f"/dBFS|❌/.test(document.querySelector('#{mode}-feedback').innerText)", timeout=WAIT_MS
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


def wait_new_links(page, container: str, before: str) -> None:
    """Wait until `container` shows download links to another output than `before`."""
    page.wait_for_function(
        f"(before) => {{ const a = document.querySelector('{container} a.cosy-download');"
        " return a !== null && a.href !== before; }",
        arg=before,
        timeout=WAIT_MS,
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
    banner = page.locator("#cosy-demo-banner")
    banner.wait_for()
    assert "demo model" in banner.inner_text()
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


def play_result(page, mode: str) -> None:
    """Press play on the result player; the browser must load and start the stored file."""
    result = page.locator(f"#{mode}-result")
    play = result.locator("button[aria-label='Play'], button[aria-label='play']").first
    play.click()
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


def test_cross_lingual_not_streamed_mp3(page, shared_dir):
    open_tab(page, "cross_lingual")
    feedback = upload_prompt(page, "cross_lingual", shared_dir / "audio" / "prompt_zh_24k.wav")
    assert "usable" in feedback
    page.fill("#cross_lingual-text textarea", "Hello there.")
    page.uncheck("#cross_lingual-stream input")
    page.click("#cross_lingual-format label:has-text('mp3')")
    page.click("#cross_lingual-dice")
    page.wait_for_function(
        "(() => { const el = document.querySelector("
        "'#cross_lingual-seed textarea, #cross_lingual-seed input');"
        " return el && /^[0-9]+$/.test(el.value); })()"
    )
    info = generate(page, "cross_lingual")
    assert "Seed" in info
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
    page.fill("#cross_lingual-text textarea", "字" * (MAX_CHARS + 5))
    assert "over" in page.get_attribute("#cross_lingual-counter .cosy-counter", "class")
    page.click("#cross_lingual-generate")
    message = error_toast(page, "error-too-long")
    assert f"{MAX_CHARS + 5} characters" in message and f"limit of {MAX_CHARS}" in message, message

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
    for _ in range(service.scheduler.concurrency + service.scheduler.queue_size + 1):
        try:
            tickets.append(service.scheduler.submit(lambda ctx: release.wait(60)))
        except QueueFull:
            break
    return tickets


def test_cancel(page, ui_server):
    release = threading.Event()
    service = ui_server.service
    blocker = service.scheduler.submit(lambda ctx: release.wait(60))  # the UI's job waits behind it
    try:
        page.fill("#cross_lingual-text textarea", "Hi.")
        page.click("#cross_lingual-generate")
        page.wait_for_timeout(1000)
        page.click("#cross_lingual-cancel")
        page.wait_for_function(
            "document.querySelector('#cross_lingual-info').innerText.includes('Cancelled')"
        )
        shot(page, "cancelled")
    finally:
        release.set()
        blocker.wait(30)
    no_traceback(page)


def test_admin_panel(page, ui_server):
    open_tab(page, "admin")
    page.wait_for_function("document.querySelector('#admin-status').innerText.includes('Queue')")
    status = page.inner_text("#admin-status")
    assert "ready" in status and "running" in status, status
    page.wait_for_function("document.querySelector('#admin-logs').innerText.length > 0")
    shot(page, "admin")
    page.click("#admin-restart")
    page.wait_for_function("document.querySelector('#admin-message').innerText.includes('Reloading')")
    ui_server.wait_ready()
    page.click("#admin-refresh")
    page.wait_for_function("document.querySelector('#admin-status').innerText.includes('ready')")
    shot(page, "admin-restarted")


def test_api_key_user(browser, ui_server, shared_dir):
    """A user-role API key signs in too (same credentials as the API), sees no admin panel, can't change
    the voice library, and its history holds only its own results."""
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
        generate(page, "zero_shot")
        open_tab(page, "history")
        page.wait_for_function("document.querySelector('#history-table').innerText.includes('钥匙用户')")
        open_tab(page, "voices")
        page.fill("#enrol-name textarea, #enrol-name input", "carol")
        page.set_input_files("#enrol-audio input[type=file]", str(shared_dir / "audio" / "prompt_zh_24k.wav"))
        page.click("#enrol-submit")
        assert "admin" in error_toast(page, "user-key-no-admin")
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
