"""UI sign-in sessions in a real browser (headless Debian Chromium, Playwright): one browser switching
identities (key as alice, password as admin, key as bob) sees only the last one on the page and in
Gradio's events, its cookie is an http-only session token and never the key, and a page of another origin
(another port of the same host included) can't read the UI with the user's cookies."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from browser import chromium
from conftest import REPO_ROOT, LiveServer

pytestmark = pytest.mark.slow

USER, PASSWORD = "admin", "sessions-e2e-password"
WAIT_MS = 60_000
ARTIFACTS = REPO_ROOT / "test-artifacts" / "ui-sessions"


def no_model(_settings, _voices):
    raise RuntimeError("no model in this test: the page works without one")


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory):
    from cosyserve.api.app import create_app
    from cosyserve.service.assembly import Service
    from cosyserve.service.settings import Settings
    from cosyserve.ui.app import mount_ui

    settings = Settings(
        model="demo",
        device="cpu",
        data_dir=tmp_path_factory.mktemp("sessions-data"),
        ui_username=USER,
        ui_password=PASSWORD,
        signing_secret="test-signing-secret-0123456789abcdef",
    )
    service = Service(settings, synthesizer_factory=no_model)
    app = create_app(service)
    mount_ui(app, service)
    server = LiveServer(app, service).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def context(ui_server):
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1200, "height": 900}, locale="en-US")
        context.set_default_timeout(WAIT_MS)
        yield context
        context.close()


def sign_in(page, base: str, *, key: str | None = None, password: str | None = None) -> None:
    page.goto(base + "/login")
    if key is not None:
        page.click("details summary")
        page.fill("#api_key", key)
    else:
        page.fill("#username", USER)
        page.fill("#password", password or "")
    page.click("#login-submit")
    page.wait_for_selector("#zero_shot-generate")


def shown_user(page, name: str) -> str:
    """Waits until the page says who is signed in, and returns that line."""
    page.wait_for_function(
        "name => document.querySelector('#cosy-user').innerText.includes('Signed in as ' + name)", arg=name
    )
    return page.inner_text("#cosy-user")


def gradio_user(page, base: str) -> tuple[str, bool]:
    """What Gradio's first-load event answers with this browser's cookies: (the signed-in line, admin tab)."""
    started = page.request.post(base + "/gradio_api/call/on_load", data={"data": ["en"]})
    assert started.status == 200, started.text()
    stream = page.request.get(f"{base}/gradio_api/call/on_load/{started.json()['event_id']}").text()
    data = json.loads(stream.split("event: complete\ndata:", 1)[1].strip().splitlines()[0])
    _lang_state, _lang, user, admin_tab, *_ = data
    return user, admin_tab.get("visible") is True


def session_cookie(context) -> dict:
    cookies = context.cookies()
    assert [cookie["name"] for cookie in cookies] == ["cosyserve_session"], cookies
    return cookies[0]


def test_one_browser_switches_identities(context, ui_server):
    base, service = ui_server.url, ui_server.service
    _, alice = service.keys.create("alice", role="user")
    _, bob = service.keys.create("bob", role="user")
    page = context.new_page()

    sign_in(page, base, key=alice)
    assert "alice" in shown_user(page, "alice")
    assert page.get_by_role("tab", name="Admin").count() == 0
    cookie = session_cookie(context)
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax" and alice not in cookie["value"]
    assert page.evaluate("document.cookie") == ""  # the page's scripts can't read it
    alice_token = cookie["value"]
    line, admin_tab = gradio_user(page, base)
    assert "Signed in as alice" in line and not admin_tab
    assert page.request.get(base + "/v1/me").json()["name"] == "alice"

    sign_in(page, base, password=PASSWORD)
    shown_user(page, "admin")
    page.get_by_role("tab", name="Admin").wait_for()
    line, admin_tab = gradio_user(page, base)
    assert "Signed in as admin" in line and admin_tab
    admin_token = session_cookie(context)["value"]
    assert service.access.identify(None, alice_token) is None  # alice's session ended on the server

    sign_in(page, base, key=bob)
    shown_user(page, "bob")
    assert page.get_by_role("tab", name="Admin").count() == 0
    line, admin_tab = gradio_user(page, base)
    assert "Signed in as bob" in line and "admin" not in line and "alice" not in line and not admin_tab
    assert page.request.get(base + "/admin/status").status == 403
    assert service.access.identify(None, admin_token) is None
    assert bob not in session_cookie(context)["value"]

    page.click("#cosy-logout")
    page.locator("#login-submit").wait_for()
    assert context.cookies() == []
    assert page.request.get(base + "/v1/me").status == 401
    page.close()


def notice(page, says: str) -> str:
    """Waits until the session bar at the top of the page says `says`, and returns the bar's text."""
    page.wait_for_function(
        "says => (document.querySelector('#cosy-session-notice') || {}).innerText?.includes(says)", arg=says
    )
    return page.inner_text("#cosy-session-notice")


def test_a_page_says_when_its_browser_is_someone_else_now_or_signed_out(context, ui_server):
    """Two tabs of one browser: the second signs in as dave, and the first (carol's page) says so when it
    comes back into view, header included; then dave's key is revoked, and dave's page says the sign-in
    ended as soon as one of its calls is refused (its status poll), with a link back to the login."""
    base, service = ui_server.url, ui_server.service
    _, carol = service.keys.create("carol", role="user")
    dave_record, dave = service.keys.create("dave", role="user")
    first, second = context.new_page(), context.new_page()
    sign_in(first, base, key=carol)
    shown_user(first, "carol")
    assert first.locator("#cosy-session-notice").count() == 0
    sign_in(second, base, key=dave)
    shown_user(second, "dave")

    first.evaluate("window.dispatchEvent(new Event('focus'))")  # as when the user comes back to the tab
    assert "now signed in as dave" in notice(first, "dave")
    shown_user(first, "dave")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    first.screenshot(path=str(ARTIFACTS / "someone-else-now.png"))
    assert second.locator("#cosy-session-notice").count() == 0  # dave's own page is dave's

    service.keys.revoke(dave_record.id)
    assert "sign-in has ended" in notice(second, "Sign in again")  # within a status poll (3 s)
    assert "Not signed in" in second.inner_text("#cosy-user")
    second.screenshot(path=str(ARTIFACTS / "signed-out.png"))
    link = second.locator("#cosy-session-notice a")
    assert link.get_attribute("href").startswith("/login?next=")
    link.click()
    second.locator("#login-submit").wait_for()
    sign_in(second, base, key=carol)  # carol again: the first page is carol's once more
    first.evaluate("window.dispatchEvent(new Event('focus'))")
    first.wait_for_function("!document.querySelector('#cosy-session-notice')")
    shown_user(first, "carol")
    first.close()
    second.close()


@pytest.fixture(scope="module")
def foreign_site():
    """A page of another origin on this host (a real loopback server: Chromium lets only pages that are
    themselves on loopback call loopback addresses, so a faked page would be stopped before CORS)."""

    class BlankPage(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<!doctype html><html><body>another site</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), BlankPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_other_origins_can_not_read_the_ui(context, ui_server, foreign_site):
    """A page on another port of the same host is same-site, so the browser does send the Lax cookie
    with its fetch; the UI's answer carries no CORS headers, so the browser keeps it from that page
    (Gradio alone would allow it: it trusts every localhost origin when it is reached as localhost)."""
    base = ui_server.url
    page = context.new_page()
    sign_in(page, base, password=PASSWORD)
    own = page.evaluate(
        "url => fetch(url, {credentials: 'include'}).then(r => r.status)", base + "/gradio_api/info"
    )
    assert own == 200  # the UI's own origin reads it
    for origin in (f"http://127.0.0.1:{foreign_site}", f"http://localhost:{foreign_site}"):
        page.goto(origin + "/")
        for path in ("/config", "/gradio_api/info", "/v1/me"):
            outcome = page.evaluate(
                """url => fetch(url, {credentials: 'include'})
                       .then(r => 'read ' + r.status).catch(e => 'blocked')""",
                base + path,
            )
            assert outcome == "blocked", (origin, path)
        posted = page.evaluate(
            """url => fetch(url, {method: 'POST', credentials: 'include',
                                  headers: {'Content-Type': 'application/json'}, body: '{"data": ["en"]}'})
                   .then(r => 'read ' + r.status).catch(e => 'blocked')""",
            base + "/gradio_api/call/on_load",
        )
        assert posted == "blocked", origin
    page.close()
