"""The admin tab's keys, quotas and enrolments in headless Debian Chromium (Playwright) around the demo
model: an admin signed in with the UI password creates a key with a daily quota (shown once, and it works
against the API), sees it listed with today's usage, changes its quota and revokes it, all without a
terminal; reads who enrolled each voice; sees logs without terminal colour codes, uptime in human units,
and the engine status follow a restart by itself. Screenshots go to test-artifacts/ui/ (admin-*.png)."""

from __future__ import annotations

import itertools
import logging
import re
import threading

import httpx
import pytest

from browser import chromium
from conftest import PROMPT_TRANSCRIPT, REPO_ROOT, LiveServer, sharing
from test_ui_e2e import no_traceback

pytestmark = pytest.mark.slow

ARTIFACTS = REPO_ROOT / "test-artifacts" / "ui"
USER, PASSWORD = "admin", "ui-admin-test-password-1"
WAIT_MS = 120_000  # generous: the CI machine may be busy
_SHOTS = itertools.count(1)


def shot(page, name: str) -> None:
    """A numbered screenshot of this module's session (named apart from test_ui_e2e's own)."""
    page.screenshot(path=str(ARTIFACTS / f"admin-{next(_SHOTS):02d}-{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def ui_server(api_synthesizer, demo_model_path, tmp_path_factory, shared_dir):
    from cosyserve.api.app import create_app
    from cosyserve.service.assembly import Service
    from cosyserve.service.settings import Settings
    from cosyserve.ui.app import mount_ui

    settings = Settings(
        model=str(demo_model_path),
        device="cpu",
        data_dir=tmp_path_factory.mktemp("ui-admin-data"),
        concurrency=1,
        ui_username=USER,
        ui_password=PASSWORD,
        signing_secret="test-signing-secret-0123456789abcdef",
    )
    load = sharing(api_synthesizer)
    model_gate = threading.Event()  # cleared: a (re)load waits, so a test sees the engine mid-restart
    model_gate.set()

    def gated_load(settings, voices):
        model_gate.wait(WAIT_MS / 1000)
        return load(settings, voices)

    service = Service(settings, synthesizer_factory=gated_load)
    app = create_app(service)
    mount_ui(app, service)
    server = LiveServer(app, service).start().wait_ready()
    _, plaintext = service.keys.create("dora", role="user")
    response = httpx.post(
        f"{server.url}/v1/voices",
        headers={"X-API-Key": plaintext},
        data={"name": "dora-voice", "transcript": PROMPT_TRANSCRIPT, "consent": "true"},
        files={"audio": ("p.wav", (shared_dir / "audio" / "prompt_zh_24k.wav").read_bytes(), "audio/wav")},
        timeout=120,
    )
    assert response.status_code == 201, response.text
    server.model_gate = model_gate
    yield server
    server.stop()


@pytest.fixture(scope="module")
def page(ui_server):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("admin-*.png"):
        old.unlink()
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 1000}, locale="en-US")
        context.set_default_timeout(WAIT_MS)
        page = context.new_page()
        page.goto(ui_server.url + "/")
        page.fill("#username", USER)
        page.fill("#password", PASSWORD)
        page.click("#login-submit")
        page.wait_for_selector("#zero_shot-generate")
        yield page
        context.close()


@pytest.fixture(autouse=True)
def screenshot_on_failure(request, page):
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        shot(page, f"failed-{request.node.name}")


def wait_text(page, selector: str, wanted: str) -> str:
    page.wait_for_function(
        "([sel, wanted]) => (document.querySelector(sel) || {}).innerText?.includes(wanted)",
        arg=[selector, wanted],
    )
    return page.inner_text(selector)


def choose_key(page, label_start: str) -> None:
    page.click("#admin-key-pick input")
    page.get_by_role("option", name=re.compile("^" + re.escape(label_start))).click()


def test_status_enrolments_and_logs(page, ui_server):
    logging.getLogger("cosyserve.test").warning("\x1b[1;31mred alert\x1b[0m from a coloured logger")
    page.get_by_role("tab", name="Admin").click()
    status = wait_text(page, "#admin-status", "Uptime")
    assert re.search(r"Uptime\s+\d+ (s|min)\b", status), status  # e.g. "42 s", "1 min 3 s"
    enrolments = wait_text(page, "#admin-enrolments", "dora-voice")
    row = next(line for line in enrolments.splitlines() if "dora-voice" in line)
    dora = next(key for key in ui_server.service.keys.list() if key.name == "dora")
    assert f"dora (key:{dora.id})" in row and "UTC" in row and "no" in row, row  # owner, by, date, private
    page.wait_for_function("document.querySelector('#admin-logs pre')?.textContent.includes('red alert')")
    logs = page.text_content("#admin-logs pre")
    assert "\x1b" not in logs and "[1;31m" not in logs and "red alert from a coloured logger" in logs
    shot(page, "status-enrolments-logs")


def test_create_a_key_with_a_quota_then_change_it_and_revoke_it(page, ui_server):
    service = ui_server.service
    page.fill("#admin-key-name input, #admin-key-name textarea", "team-laptop")
    page.fill("#admin-key-quota input", "900")
    page.click("#admin-key-create")
    created = wait_text(page, "#admin-key-created", "shown only this once")
    plaintext = re.search(r"cs_\S+", created).group(0)
    shot(page, "key-created")
    key = service.keys.authenticate(plaintext)
    assert key is not None and key.name == "team-laptop" and key.daily_audio_seconds_quota == 900.0
    me = httpx.get(f"{ui_server.url}/v1/me", headers={"X-API-Key": plaintext}, timeout=30).json()
    assert me["name"] == "team-laptop" and me["quota"]["limit_s"] == 900.0  # the shown key works
    assert page.input_value("#admin-key-name input, #admin-key-name textarea") == ""
    service.access.quota.add(key, 12.5)  # some audio made today
    page.click("#admin-refresh")  # the key is shown once: a refresh clears it
    table = wait_text(page, "#admin-keys", "12.5 s")
    row = next(line for line in table.splitlines() if "team-laptop" in line)
    assert "900 s" in row and "active" in row and "0 s" in row, row  # used, reserved, quota
    page.wait_for_function("!document.querySelector('#admin-key-created').innerText.includes('cs_')")
    assert plaintext not in page.inner_text("body")

    choose_key(page, f"{key.id} · team-laptop")
    page.fill("#admin-key-new-quota input", "60")
    page.click("#admin-key-set-quota")
    wait_text(page, "#admin-keys-message", "Daily quota of key team-laptop: 60 s")
    assert service.keys.get(key.id).daily_audio_seconds_quota == 60.0
    assert "60 s" in next(
        line for line in page.inner_text("#admin-keys").splitlines() if "team-laptop" in line
    )
    shot(page, "quota-set")

    page.click("#admin-key-revoke")  # nothing picked (the list was refreshed): said so, nothing revoked
    wait_text(page, "#admin-keys-message", "Choose a key first")
    assert service.keys.get(key.id).active
    choose_key(page, f"{key.id} · team-laptop")
    page.click("#admin-key-revoke")  # a question first: Keep it leaves the key as it was
    wait_text(page, "#admin-keys-message", "Revoke key team-laptop")
    shot(page, "key-revoke-question")
    page.click("#admin-key-keep")
    page.locator("#admin-key-confirm-row").wait_for(state="hidden")
    assert service.keys.get(key.id).active
    page.click("#admin-key-revoke")
    wait_text(page, "#admin-keys-message", "can't be undone")
    page.click("#admin-key-confirm-revoke")
    wait_text(page, "#admin-keys-message", "is revoked")
    page.locator("#admin-key-confirm-row").wait_for(state="hidden")
    assert not service.keys.get(key.id).active
    row = next(line for line in page.inner_text("#admin-keys").splitlines() if "team-laptop" in line)
    assert "revoked" in row, row
    gone = httpx.get(f"{ui_server.url}/v1/me", headers={"X-API-Key": plaintext}, timeout=30)
    assert gone.status_code == 401
    shot(page, "key-revoked")


def test_a_key_gets_a_new_secret_after_a_question(page, ui_server):
    """New secret: the key keeps its id (its voices, outputs and usage), the old secret stops, the new one
    is shown once."""
    service = ui_server.service
    key, old = service.keys.create("leaky-laptop", "user")
    page.click("#admin-refresh")
    choose_key(page, f"{key.id} · leaky-laptop")
    page.click("#admin-key-rotate")
    wait_text(page, "#admin-keys-message", "Give key leaky-laptop")
    assert page.is_visible("#admin-key-confirm-rotate") and not page.is_visible("#admin-key-confirm-revoke")
    page.click("#admin-key-confirm-rotate")
    created = wait_text(page, "#admin-key-created", "has a new secret")
    new = re.search(r"cs_\S+", created).group(0)
    assert service.keys.authenticate(old) is None and service.keys.authenticate(new).id == key.id
    page.locator("#admin-key-confirm-row").wait_for(state="hidden")
    shot(page, "key-rotated")


def test_a_bad_key_name_is_refused_with_a_reason(page, ui_server):
    count = len(ui_server.service.keys.list())
    page.fill("#admin-key-name input, #admin-key-name textarea", "")
    page.click("#admin-key-create")
    wait_text(page, "#admin-keys-message", "key name must be 1 to")
    assert len(ui_server.service.keys.list()) == count
    no_traceback(page)


def test_the_status_follows_a_restart_by_itself(page, ui_server):
    ui_server.model_gate.clear()  # the reload waits until the panel has shown the engine restarting
    try:
        page.click("#admin-restart")
        page.click("#admin-confirm")
        wait_text(page, "#admin-status", "restarting")  # no refresh clicked
        assert "Reloading" in page.inner_text("#admin-message")
        shot(page, "restarting")
    finally:
        ui_server.model_gate.set()
    wait_text(page, "#admin-message", "Restart finished; the engine is ready")  # still no refresh clicked
    assert "restarting" not in page.inner_text("#admin-status")
    assert ui_server.service.readiness()["state"] == "ready"
    shot(page, "restarted")


def test_the_tab_in_chinese(page):
    page.click("#cosy-lang label:has-text('中文')")
    page.get_by_role("tab", name="管理").wait_for()
    page.click("#admin-refresh")
    wait_text(page, "#admin-keys", "已吊销")
    status = page.inner_text("#admin-status")
    assert re.search(r"\d+ (秒|分钟)", status), status
    shot(page, "chinese")
