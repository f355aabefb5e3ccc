"""The web UI's Batch tab in headless Chromium (Playwright) around the demo model: upload a CSV script and
an SRT file, pick a voice, watch the progress bar advance and the per-item table fill, play an item, and
download the ZIP, the track and its timing report. Screenshots go to test-artifacts/ui-batch/."""

from __future__ import annotations

import csv
import io
import threading
import zipfile
from pathlib import Path

import pytest
import soundfile as sf

from browser import chromium
from conftest import REPO_ROOT, LiveServer, enrol_voice, sharing

pytestmark = pytest.mark.slow

ARTIFACTS = REPO_ROOT / "test-artifacts" / "ui-batch"
WAIT_MS = 180_000
LINES = 10  # enough for the bar to be seen advancing step by step
SRT = "".join(
    f"{n}\n00:00:{2 * n - 1:02d},000 --> 00:00:{2 * n:02d},500\n第{n}句。\n\n" for n in range(1, 7)
)  # six cues, the last ending at 12.5 s


@pytest.fixture(scope="module")
def ui_server(api_synthesizer, demo_model_path, tmp_path_factory, prompt_wav_bytes):
    from cosyserve.api.app import create_app
    from cosyserve.service.assembly import Service
    from cosyserve.service.settings import Settings
    from cosyserve.ui.app import mount_ui

    settings = Settings(
        model=str(demo_model_path),
        device="cpu",
        data_dir=tmp_path_factory.mktemp("ui-batch-data"),
        concurrency=1,
        max_text_chars=40,
        signing_secret="test-signing-secret-0123456789abcdef",
    )
    service = Service(settings, synthesizer_factory=sharing(api_synthesizer))
    app = create_app(service)
    mount_ui(app, service)
    server = LiveServer(app, service).start().wait_ready()
    with server.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def page(ui_server):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with chromium() as browser:
        context = browser.new_context(
            viewport={"width": 1400, "height": 1100}, locale="en-US", accept_downloads=True
        )
        context.set_default_timeout(WAIT_MS)
        page = context.new_page()
        page.goto(ui_server.url + "/")
        page.get_by_role("tab", name="Batch").click()
        page.wait_for_selector("#batch-start")
        yield page
        context.close()


def upload_and_start(page, path: Path) -> list[int]:
    """Upload `path`, pick alice, start, and record the progress bar's values until the batch ends."""
    clear = page.locator("#batch-file button[aria-label='Clear']")
    if clear.count():
        clear.first.click()
    page.set_input_files("#batch-file input[type=file]", str(path))
    page.click("#batch-voice input")
    page.get_by_role("option", name="alice").click()
    before = page.evaluate(
        "(document.querySelector('#batch-progress .cosy-batch') || {}).dataset?.batch || ''"
    )
    page.click("#batch-start")
    page.wait_for_function(
        "(before) => { const el = document.querySelector('#batch-progress .cosy-batch');"
        " return el && el.dataset.batch !== before; }",
        arg=before,
    )
    seen: list[int] = []
    read = (
        "(() => { const el = document.querySelector('#batch-progress .cosy-batch');"
        " return [Number(el.querySelector('#batch-bar').getAttribute('value')), el.dataset.state]; })()"
    )
    while True:
        value, state = page.evaluate(read)  # one read: the bar and the state of the same render
        if not seen or value != seen[-1]:
            seen.append(value)
        if state in ("done", "failed", "cancelled"):
            assert state == "done", page.inner_text("#batch-progress")
            return seen
        page.wait_for_timeout(200)


def download(page, selector: str, name: str) -> bytes:
    with page.expect_download() as info:
        page.click(selector)
    target = ARTIFACTS / name
    info.value.save_as(target)
    return target.read_bytes()


def test_the_empty_table_is_headed_in_the_language_chosen(page) -> None:
    """Its headers followed a language switch only once a batch was shown."""
    page.click("#cosy-lang label:has-text('中文')")
    page.wait_for_function("document.querySelector('#batch-start').innerText.includes('开始')")
    page.wait_for_function(
        "document.querySelector('#batch-table').innerText.includes('状态')", timeout=10_000
    )
    page.click("#cosy-lang label:has-text('English')")
    page.wait_for_function(
        "document.querySelector('#batch-table').innerText.includes('State')", timeout=10_000
    )


def test_a_csv_script_runs_with_a_live_progress_bar(page, tmp_path) -> None:
    script = tmp_path / "lesson.csv"
    script.write_text("name,text\n" + "".join(f"line{n},第{n}句话。\n" for n in range(1, LINES + 1)))
    seen = upload_and_start(page, script)
    assert seen[-1] == LINES and len(seen) >= 3 and seen == sorted(seen), seen  # it advanced, step by step
    page.screenshot(path=str(ARTIFACTS / "01-batch-done.png"), full_page=True)
    table = page.inner_text("#batch-table")
    assert "line1" in table and f"line{LINES}" in table and "done" in table
    assert "Check" in table and ("⚠ listen" in table or "✓" in table)  # each item's checks, as check_these
    page.click("#batch-pick input")
    page.get_by_role("option", name="0002 · line2").click()
    page.wait_for_selector("#batch-audio audio[src]", state="attached")
    with zipfile.ZipFile(io.BytesIO(download(page, "#batch-zip", "batch.zip"))) as zipped:
        names = zipped.namelist()
        manifest = list(csv.DictReader(io.StringIO(zipped.read("manifest.csv").decode())))
    assert len([n for n in names if n.endswith(".wav")]) == LINES and len(manifest) == LINES
    assert manifest[0]["file"] == "0001_line1.wav" and manifest[0]["voice"]


def test_an_srt_becomes_a_track_and_a_report(page, tmp_path) -> None:
    subtitles = tmp_path / "episode.srt"
    subtitles.write_text(SRT, encoding="utf-8")
    seen = upload_and_start(page, subtitles)
    assert seen[-1] == 6
    page.screenshot(path=str(ARTIFACTS / "02-dub-done.png"), full_page=True)
    audio, rate = sf.read(io.BytesIO(download(page, "#batch-track", "dub.wav")))
    assert abs(len(audio) / rate - 12.5) <= 0.05
    report = download(page, "#batch-report", "report.csv").decode()
    assert report.startswith("position,cue,file_position,text,planned_start_s")
    assert len(report.strip().splitlines()) == 7


def test_a_reloaded_page_finds_its_batches_again(page, ui_server) -> None:
    """The page follows one batch; after a reload "Your batches" lists them all, picking one shows its
    progress, items and downloads, and a batch still running is followed again as soon as the tab opens."""
    service = ui_server.service
    release = threading.Event()
    blocker = service.scheduler.submit(lambda ctx: release.wait(60))  # the new batch waits behind it
    try:
        with ui_server.client() as client:
            submitted = client.post("/v1/batches", json={"voice": "alice", "items": ["一。", "二。", "三。"]})
        assert submitted.status_code == 202, submitted.text
        waiting = submitted.json()["id"]
        again = page.context.new_page()
        again.goto(ui_server.url + "/")
        again.get_by_role("tab", name="Batch").click()
        again.wait_for_function(  # the running one, without a click
            "id => { const el = document.querySelector('#batch-progress .cosy-batch');"
            " return el && el.dataset.batch === id && el.dataset.state === 'queued'; }",
            arg=waiting,
        )
        release.set()
        again.wait_for_function(
            "() => document.querySelector('#batch-progress .cosy-batch').dataset.state === 'done'"
        )
        again.click("#batch-recent input")
        options = again.get_by_role("option")
        labels = [options.nth(n).inner_text() for n in range(options.count())]
        assert len(labels) == 3, labels  # this test's, the dub's and the script's, newest first
        assert "3 items · done" in labels[0] and "subtitles · 6 items · done" in labels[1], labels
        assert "script · 10 items · done" in labels[2], labels
        options.nth(2).click()
        again.wait_for_function(
            "() => document.querySelector('#batch-progress').innerText.includes('10 / 10')"
        )
        assert "line10" in again.inner_text("#batch-table")
        again.wait_for_selector("#batch-zip")
        assert again.locator("#batch-track").count() == 0  # the script's links, not the dub's
        again.screenshot(path=str(ARTIFACTS / "03-reloaded.png"), full_page=True)
        again.close()
    finally:
        release.set()
        blocker.wait(30)


def test_the_tab_speaks_chinese(page) -> None:
    page.click("#cosy-lang label:has-text('中文')")
    page.wait_for_function("document.querySelector('#batch-start').innerText.includes('开始')")
    page.get_by_role("tab", name="批量与配音").wait_for()
    page.wait_for_function("document.querySelector('#batch-progress').innerText.includes('已处理')")
    assert "完成" in page.inner_text("#batch-table")
    page.screenshot(path=str(ARTIFACTS / "04-zh.png"), full_page=True)
