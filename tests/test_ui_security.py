"""The UI's front door over HTTP (no browser, no model): login, the same credentials as the API, no file
access outside Gradio's own uploads, upload size limits, and the API still answering beside the UI."""

from __future__ import annotations

import json
import re
import time
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

USER, PASSWORD = "admin", "security-test-password"
HTML = {"Accept": "text/html"}
LOGOUT_LINK = ' · <a href="/logout" id="cosy-logout">Log out</a>'


def no_model(_settings, _voices):
    raise RuntimeError("no model in this test")


def make_client(tmp_path, **settings) -> TestClient:
    from cosyserve.api.app import create_app
    from cosyserve.service.assembly import Service
    from cosyserve.service.settings import Settings
    from cosyserve.ui.app import mount_ui

    values = {
        "model": "demo",
        "device": "cpu",
        "data_dir": tmp_path / "data",
        "signing_secret": "test-signing-secret-0123456789abcdef",
        "max_upload_mb": 0.01,  # 10 kB
        **settings,
    }
    service = Service(Settings(**values), synthesizer_factory=no_model)
    app = create_app(service)
    mount_ui(app, service)
    return TestClient(app, follow_redirects=False)


@pytest.fixture()
def client(tmp_path):
    with make_client(tmp_path, ui_username=USER, ui_password=PASSWORD) as client:
        yield client


def login(client: TestClient) -> None:
    response = client.post("/login", data={"username": USER, "password": PASSWORD, "next": "/"})
    assert response.status_code == 303 and response.headers["location"] == "/"
    assert "cosyserve_session" in response.cookies


def test_the_page_needs_a_login(client):
    response = client.get("/", headers=HTML)
    assert response.status_code == 303
    assert response.headers["location"] == "/login?next=/"
    assert client.get("/login").status_code == 200
    assert client.get("/gradio_api/info").status_code == 401  # the event API too
    assert client.post("/gradio_api/upload", files={"files": ("a.wav", b"RIFF")}).status_code == 401


def test_wrong_password_then_right_one(client):
    failed = client.post("/login", data={"username": USER, "password": "nope"})
    assert failed.status_code == 401 and "login-error" in failed.text
    assert "cosyserve_session" not in failed.cookies
    login(client)
    page = client.get("/", headers=HTML)
    assert page.status_code == 200 and "<html" in page.text.lower()
    me = client.get("/v1/me")  # the same session works for the API
    assert me.status_code == 200 and me.json()["kind"] == "session"
    logout = client.get("/logout")
    assert logout.status_code == 303
    client.cookies.clear()
    assert client.get("/", headers=HTML).status_code == 303


def test_an_api_key_signs_in_too(client):
    service = client.app.state.service
    _, plaintext = service.keys.create("ui", role="user")
    assert client.post("/login", data={"api_key": "cs_" + "x" * 43}).status_code == 401
    response = client.post("/login", data={"api_key": plaintext, "next": "/?x=1"})
    assert response.status_code == 303 and response.headers["location"] == "/?x=1"
    assert client.get("/", headers=HTML).status_code == 200
    client.cookies.clear()
    assert client.get("/", headers={**HTML, "Authorization": f"Bearer {plaintext}"}).status_code == 200


def test_an_upload_is_fetched_by_whoever_uploaded_it(client):
    """A recording uploaded through the page (to clone, or to enrol) was served to any signed-in user
    holding its URL; the page's own copies already were not."""
    service = client.app.state.service
    keys = {name: service.keys.create(name, role="user")[1] for name in ("alice", "bob")}

    def sign_in(name: str) -> None:
        client.cookies.clear()
        assert client.post("/login", data={"api_key": keys[name], "next": "/"}).status_code == 303

    sign_in("alice")
    uploaded = client.post("/gradio_api/upload", files={"files": ("mine.wav", b"RIFF-alice-only")})
    assert uploaded.status_code == 200, uploaded.text
    path = uploaded.json()[0]
    assert client.get(f"/gradio_api/file={path}").status_code == 200
    sign_in("bob")
    assert client.get(f"/gradio_api/file={path}").status_code == 404
    alices_folder = path.rsplit("/", 2)[1]  # a file named like alice's folder claims nothing of it
    assert client.post("/gradio_api/upload", files={"files": (alices_folder, b"RIFF-x")}).status_code == 200
    assert client.get(f"/gradio_api/file={path}").status_code == 404
    bobs = client.post("/gradio_api/upload", files={"files": ("b.wav", b"RIFF-bob")}).json()[0]
    sneaky = (
        bobs.rsplit("/", 2)[0] + "/" + bobs.rsplit("/", 2)[1] + "/../" + path.rsplit("/", 2)[1] + "/mine.wav"
    )
    assert client.get(f"/gradio_api/file={sneaky}").status_code == 404
    client.cookies.clear()
    login(client)  # the UI password: an admin
    assert client.get(f"/gradio_api/file={path}").status_code == 200


def test_no_files_outside_gradios_uploads(client, tmp_path):
    login(client)
    service = client.app.state.service
    data_dir = service.settings.storage.data_dir
    secret = data_dir / "inside-data-dir.txt"
    secret.write_text("private")
    outside = tmp_path / "outside.txt"
    outside.write_text("private")
    for target in (
        str(secret),
        str(outside),
        "/etc/passwd",
        str(data_dir / ".." / "outside.txt"),
        "../../../../etc/passwd",
        quote("/etc/passwd", safe=""),
        str(service.outputs.root / "output_20250101_000000.wav"),
    ):
        response = client.get(f"/gradio_api/file={target}")
        assert response.status_code in (403, 404), (target, response.status_code)
        assert "private" not in response.text and "root:" not in response.text


def test_gradios_monitoring_is_off(client):
    """Its /monitoring/summary gave any signed-in user everyone's event counts (admin actions included)."""
    login(client)
    for path in ("/gradio_api/monitoring/summary", "/gradio_api/monitoring"):
        answer = client.get(path)
        assert answer.status_code in (403, 404) and "do_create" not in answer.text, (path, answer.status_code)


def test_uploads_are_size_limited(client):
    login(client)
    small = client.post("/gradio_api/upload", files={"files": ("small.wav", b"RIFF" + b"\0" * 1000)})
    assert small.status_code == 200
    big = client.post("/gradio_api/upload", files={"files": ("big.wav", b"RIFF" + b"\0" * 50_000)})
    assert big.status_code == 413


def test_the_api_still_answers_beside_the_ui(client):
    assert client.get("/health").status_code == 200
    assert client.get("/docs").status_code == 200
    assert client.get("/v1/voices").status_code == 401  # the API keeps its own auth


def test_unknown_routes_answer_with_the_error_envelope(client):
    """The UI is mounted at "/", so it answers every path the API doesn't: still the one envelope."""
    for method, path in [("GET", "/v1/nothing-here"), ("POST", "/admin/nope"), ("GET", "/gradio_api/zzz")]:
        response = client.request(method, path)
        assert response.status_code == 404
        error = response.json()["error"]
        assert error["code"] == "not_found" and path in error["message"]
        assert error["request_id"] == response.headers["x-request-id"]


def test_an_api_route_called_with_another_method_is_405_not_404(client):
    """The UI at "/" took such a request and answered "no such endpoint" (a new user's curl GET /v1/tts)."""
    for method, path, allowed in [("GET", "/v1/tts", "POST"), ("PUT", "/v1/audio/speech", "POST"),
                                  ("PATCH", "/v1/jobs", "GET, POST")]:  # fmt: skip
        response = client.request(method, path)
        assert response.status_code == 405, (method, path, response.text)
        assert (
            response.headers["allow"] == allowed and response.json()["error"]["code"] == "method_not_allowed"
        )
        assert allowed.split(",")[0] in response.json()["error"]["message"]


def test_without_any_auth_the_page_is_open(tmp_path):
    with make_client(tmp_path) as client:
        assert client.get("/", headers=HTML).status_code == 200
        assert client.get("/login").status_code == 303  # nothing to log in to


# -- sessions: the cookie holds no key, one login at a time, logout and revocation end it -------------------


def session_token(response) -> str:
    """The session token a login set (the cookie's value), checking the cookie's flags on the way."""
    cookies = [c for c in response.headers.get_list("set-cookie") if c.startswith("cosyserve_session=")]
    assert len(cookies) == 1, cookies
    flags = [part.strip().lower() for part in cookies[0].split(";")]
    assert "httponly" in flags and "samesite=lax" in flags and "path=/" in flags
    assert f"max-age={30 * 86400}" in flags
    return cookies[0].split(";")[0].split("=", 1)[1]


def browser_with(client: TestClient, token: str) -> TestClient:
    """Another browser on the same server holding this session cookie."""
    other = TestClient(client.app, follow_redirects=False)
    other.cookies.set("cosyserve_session", token)
    return other


def page_user(client: TestClient) -> tuple[str, bool] | None:
    """What the page's first-load event answers for this browser: (signed-in line, admin tab shown), or
    None when Gradio refuses it."""
    started = client.post("/gradio_api/call/on_load", json={"data": ["en"]})
    if started.status_code == 401:
        return None
    assert started.status_code == 200, started.text
    stream = client.get(f"/gradio_api/call/on_load/{started.json()['event_id']}")
    data = json.loads(stream.text.split("event: complete\ndata:", 1)[1].strip().splitlines()[0])
    _lang_state, _lang, user, admin_tab, *_ = data
    user = re.sub(r"<span [^>]*>", "<span>", user)  # without the session watch's attributes
    return user, admin_tab.get("visible") is True


def key_login(client: TestClient, plaintext: str):
    response = client.post("/login", data={"api_key": plaintext, "next": "/"})
    assert response.status_code == 303, response.text
    return response


def test_the_login_cookie_holds_no_key(client):
    _, plaintext = client.app.state.service.keys.create("alice", role="user")
    response = key_login(client, plaintext)
    token = session_token(response)
    assert plaintext not in token and all(plaintext not in c for c in response.headers.get_list("set-cookie"))
    assert "secure" not in response.headers["set-cookie"].lower()  # plain http: no Secure flag
    legacy = [c for c in response.headers.get_list("set-cookie") if c.startswith("cosyserve_ui_key=")]
    assert legacy and "max-age=0" in legacy[0].lower()  # an old version's raw-key cookie is cleared
    with TestClient(client.app, base_url="https://testserver", follow_redirects=False) as https:
        secure = key_login(https, plaintext)
        assert "secure" in [part.strip().lower() for part in secure.headers["set-cookie"].split(";")]


def test_old_style_cookies_carry_nothing(client):
    """The raw key in the old cookie, or an old signed session token, signs no one in any more."""
    from cosyserve.service.access import signing

    service = client.app.state.service
    _, plaintext = service.keys.create("alice", role="admin")
    secret = service.settings.resolve_signing_secret().get_secret_value()
    for name, value in (
        ("cosyserve_ui_key", plaintext),
        ("cosyserve_session", signing.sign_token(USER, int(time.time()) + 3600, secret)),
        ("cosyserve_session", plaintext),
    ):
        client.cookies.clear()
        client.cookies.set(name, value)
        assert client.get("/", headers=HTML).status_code == 303, name
        assert client.get("/gradio_api/info").status_code == 401
        assert client.get("/v1/me").status_code == 401
        assert page_user(client) is None
    client.cookies.clear()
    client.cookies.set("cosyserve_ui_key", plaintext)  # the login page a browser is sent to drops it at once
    cleared = [
        c for c in client.get("/login").headers.get_list("set-cookie") if c.startswith("cosyserve_ui_key=")
    ]
    assert cleared and "max-age=0" in cleared[0].lower()


def test_one_login_at_a_time(client):
    """Key login as alice, password login as admin, key login as bob in one browser: each login replaces
    the identity entirely, on the page, in Gradio's events and in the API, and ends the previous session."""
    keys = client.app.state.service.keys
    _, alice = keys.create("alice", role="user")
    _, bob = keys.create("bob", role="user")
    alice_token = session_token(key_login(client, alice))
    assert page_user(client) == ("<span>Signed in as alice</span>" + LOGOUT_LINK, False)
    assert client.get("/v1/me").json()["name"] == "alice"

    admin_login = client.post("/login", data={"username": USER, "password": PASSWORD})
    assert admin_login.status_code == 303
    admin_token = session_token(admin_login)
    assert page_user(client) == ("<span>Signed in as admin</span>" + LOGOUT_LINK, True)
    assert client.get("/v1/me").json()["kind"] == "session"
    assert browser_with(client, alice_token).get("/v1/me").status_code == 401  # alice's session ended

    session_token(key_login(client, bob))
    assert page_user(client) == ("<span>Signed in as bob</span>" + LOGOUT_LINK, False)
    assert client.get("/v1/me").json()["name"] == "bob"
    assert client.get("/admin/status").status_code == 403
    assert browser_with(client, admin_token).get("/admin/status").status_code == 401

    failed = client.post("/login", data={"username": USER, "password": "nope"})
    assert failed.status_code == 401
    assert client.get("/", headers=HTML).status_code == 303  # a failed login leaves no one signed in
    assert client.app.state.service.access.sessions.count() == 0


def test_logout_ends_the_session_on_the_server(client):
    token = session_token(client.post("/login", data={"username": USER, "password": PASSWORD}))
    logout = client.get("/logout")
    assert logout.status_code == 303
    cleared = {c.split("=", 1)[0]: c.lower() for c in logout.headers.get_list("set-cookie")}
    assert set(cleared) == {"cosyserve_session", "cosyserve_ui_key"}
    assert all("max-age=0" in cookie for cookie in cleared.values())
    assert browser_with(client, token).get("/", headers=HTML).status_code == 303  # a copy is worth nothing


def test_the_apis_login_and_logout_use_the_same_sessions(client):
    _, plaintext = client.app.state.service.keys.create("alice", role="user")
    alice_token = session_token(key_login(client, plaintext))
    api_login = client.post("/auth/login", json={"username": USER, "password": PASSWORD})
    assert api_login.status_code == 200
    token = session_token(api_login)
    assert browser_with(client, alice_token).get("/v1/me").status_code == 401
    assert client.get("/", headers=HTML).status_code == 200 and page_user(client)[1] is True
    client.post("/auth/logout")
    assert browser_with(client, token).get("/v1/me").status_code == 401


def test_revoking_a_key_signs_its_browsers_out(client):
    keys = client.app.state.service.keys
    record, plaintext = keys.create("alice", role="user")
    key_login(client, plaintext)
    assert client.get("/", headers=HTML).status_code == 200
    keys.revoke(record.id)
    page = client.get("/", headers=HTML)
    assert page.status_code == 303 and page.headers["location"].startswith("/login")
    assert page_user(client) is None and client.get("/v1/me").status_code == 401


# -- CORS: foreign pages get no answers, configured origins do ---------------------------------------------

FOREIGN_ORIGINS = ("http://localhost:9999", "http://127.0.0.1:1", "https://evil.example", "null")
UI_PATHS = ("/", "/config", "/gradio_api/info", "/gradio_api/queue/status", "/v1/me", "/health")


def cors_headers(response) -> dict[str, str]:
    return {name: value for name, value in response.headers.items() if name.startswith("access-control-")}


def test_foreign_origins_get_no_cors_answers(client):
    """Gradio alone would echo any origin with credentials (or any localhost one when the server is reached
    as localhost): a page on another port could read the signed-in user's UI."""
    login(client)
    for host in ("testserver", "localhost:7860", "127.0.0.1:7860"):
        for origin in FOREIGN_ORIGINS:
            headers = {"Origin": origin, "Host": host}
            for path in UI_PATHS:
                response = client.get(path, headers=headers)
                assert response.status_code < 400 and not cors_headers(response), (host, origin, path)
            called = client.post("/gradio_api/call/on_load", json={"data": ["en"]}, headers=headers)
            assert called.status_code == 403 and not cors_headers(called)  # another site's page acting
            for path in ("/gradio_api/queue/join", "/gradio_api/upload", "/v1/tts", "/login"):
                preflight = client.options(
                    path,
                    headers={
                        **headers,
                        "Access-Control-Request-Method": "POST",
                        "Access-Control-Request-Headers": "content-type",
                    },
                )
                assert not cors_headers(preflight), (host, origin, path, preflight.headers)
    same_site = client.get("/config", headers={"Origin": "http://testserver"})  # the page's own calls
    assert same_site.status_code == 200 and not cors_headers(same_site)


def test_another_sites_page_cannot_act_for_a_signed_in_user(client):
    """A page on another port of the same host posted a batch and enrolled a voice in the user's
    account, an image tag ran a voice preview and signed the user out, a form signed the user in as
    someone else (a team's run): acting requests a browser marks as another site's are refused."""
    login(client)
    for site in ("cross-site", "same-site"):
        foreign = {"Sec-Fetch-Site": site}
        for method, path in (("POST", "/v1/batches"), ("POST", "/v1/voices"), ("DELETE", "/v1/outputs/x")):
            answer = client.request(method, path, headers=foreign, json={})
            assert answer.status_code == 403 and answer.json()["error"]["code"] == "cross_site", (site, path)
        assert client.get("/v1/voices/alice/preview", headers=foreign).status_code == 403
        assert client.get("/logout", headers=foreign).status_code == 403
        login_form = {"username": USER, "password": PASSWORD, "next": "/"}
        assert client.post("/login", data=login_form, headers=foreign).status_code == 403
        assert client.get("/v1/me").status_code == 200  # still signed in
    old_browser = {"Origin": "https://evil.example"}  # no Sec-Fetch-Site: the Origin tells
    assert client.post("/v1/batches", headers=old_browser, json={}).status_code == 403
    own = client.post("/v1/batches", headers={"Sec-Fetch-Site": "same-origin"}, json={})
    assert own.status_code != 403  # the page's own request goes on (to its own answer)
    reading = client.get("/v1/voices", headers={"Sec-Fetch-Site": "cross-site"})
    assert reading.status_code == 200  # reading is not acting (and CORS keeps the answer from that page)


def test_a_proxys_credentials_do_not_switch_the_check_off(client, tmp_path):
    """Behind an HTTP-auth proxy the browser adds `Authorization: Basic …` (or Negotiate) to every request
    to the site, whichever page asked: any Authorization header passed the check, and the session cookie
    then decided who acted (a page on another site enrolled a voice in the user's account)."""
    login(client)
    for credentials in ("Basic Zm9vOmJhcg==", "Negotiate YIIabc", "Digest username=x"):
        forged = {"Sec-Fetch-Site": "cross-site", "Authorization": credentials}
        answer = client.post("/v1/batches", headers=forged, json={})
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "cross_site", credentials
    assert (
        client.delete(
            "/v1/outputs/x", headers={"Sec-Fetch-Site": "same-site", "Authorization": "Basic eA=="}
        ).status_code
        == 403
    )
    assert client.get("/v1/me", headers={"Authorization": "Basic eA=="}).status_code == 200  # the cookie's
    with make_client(tmp_path / "keys", ui_username=USER, ui_password=PASSWORD) as keyed:
        _, key = keyed.app.state.service.keys.create("alice", "user")
        login(keyed)
        bad = keyed.get("/v1/me", headers={"Authorization": "Bearer cs_garbage"})
        assert bad.status_code == 401  # a wrong key is refused, not replaced by the cookie's sign-in
        good = keyed.post(
            "/v1/batches", headers={"Authorization": f"Bearer {key}", "Sec-Fetch-Site": "cross-site"}, json={}
        )
        assert good.status_code != 403  # a key in the header is its holder's own


def test_configured_origins_get_cors_answers(tmp_path):
    app_origin = "https://app.example"
    settings = {"ui_username": USER, "ui_password": PASSWORD, "cors_origins": f"{app_origin}/"}
    with make_client(tmp_path, **settings) as client:
        login(client)
        for path in UI_PATHS:
            response = client.get(path, headers={"Origin": app_origin})
            assert response.headers["access-control-allow-origin"] == app_origin, path
            assert response.headers["access-control-allow-credentials"] == "true"
            assert "origin" in response.headers["vary"].lower()
            other = client.get(path, headers={"Origin": "http://localhost:9999"})
            assert not cors_headers(other), path
        preflight = client.options(
            "/gradio_api/queue/join",
            headers={
                "Origin": app_origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type",
            },
        )
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == app_origin
        assert preflight.headers["access-control-allow-headers"] == "content-type"
        assert "POST" in preflight.headers["access-control-allow-methods"]
    with make_client(tmp_path / "any", ui_username=USER, ui_password=PASSWORD, cors_origins="*") as client:
        response = client.get("/config", headers={"Origin": "https://anyone.example"})
        assert response.headers["access-control-allow-origin"] == "*"
        assert "access-control-allow-credentials" not in response.headers  # never with credentials


def test_a_page_on_a_configured_origin_reads_the_headers_that_steer_it(tmp_path):
    """`x-should-retry` was hidden from pages: OpenAI's browser SDK waited out a quota refusal's
    Retry-After (hours) and sent a timed-out synthesis three times; nor could a page see that a result
    was not saved, or a download's file name."""
    app_origin = "https://app.example"
    with make_client(tmp_path, ui_username=USER, ui_password=PASSWORD, cors_origins=app_origin) as client:
        exposed = client.get("/health", headers={"Origin": app_origin}).headers[
            "access-control-expose-headers"
        ]
    names = {name.strip().lower() for name in exposed.split(",")}
    wanted = {
        "x-should-retry",
        "retry-after",
        "x-cosyserve-saved",
        "x-cosyserve-storage-error",
        "content-disposition",
    }
    assert wanted <= names, names


def test_cors_origins_must_be_origins(tmp_path):
    from cosyserve.errors import SettingsError
    from cosyserve.service.settings import Settings

    assert Settings(cors_origins="HTTPS://App.Example/, http://localhost:3000").server.cors_origins == [
        "https://app.example",
        "http://localhost:3000",
    ]
    for wrong in ("app.example", "https://app.example/ui", "ftp://app.example"):
        with pytest.raises(SettingsError, match="not an origin"):
            Settings(cors_origins=wrong)


def test_every_synthesis_event_shares_one_limit_of_the_service_s_slots(tmp_path):
    """Gradio gives a concurrency group the smallest limit of its events: the voice library's enrol and
    preview joined "synthesis" with Gradio's default of 1, so one user's long text held every other
    user's Generate click in the page's queue until it ended (the service's fair queue never saw them)."""
    from cosyserve.api.app import create_app
    from cosyserve.service.assembly import Service
    from cosyserve.service.settings import Settings
    from cosyserve.ui.app import mount_ui
    from cosyserve.ui.bridge import UiBridge

    settings = Settings(model="demo", device="cpu", data_dir=tmp_path / "data", concurrency=1, queue_size=16)
    service = Service(settings, synthesizer_factory=no_model)
    demo = mount_ui(create_app(service), service)
    limits = [(fn.name, fn.concurrency_limit) for fn in demo.fns.values() if fn.concurrency_id == "synthesis"]
    assert len(limits) >= 5, limits  # three Generate tabs, enrol, preview
    assert {limit for _, limit in limits} == {UiBridge(service).event_slots} == {1 + 16 + 1}, limits


def test_no_other_page_may_frame_the_ui_and_signed_in_answers_stay_private(client):
    """A page on another port framed a signed-in admin's page, whose clicks there deleted a user's voice;
    answers carried no cache or type hardening."""
    login(client)
    for path in ("/", "/login", "/v1/me", "/config", "/health"):
        headers = client.get(path, headers=HTML).headers
        assert headers["x-frame-options"] == "SAMEORIGIN", path
        assert headers["content-security-policy"] == "frame-ancestors 'self'", path
        assert headers["x-content-type-options"] == "nosniff" and headers["referrer-policy"] == "same-origin"
    assert client.get("/v1/me").headers["cache-control"] == "private"  # a signed-in user's own answer
    client.cookies.clear()
    assert "cache-control" not in client.get("/health").headers  # nobody's: shared caches may keep it


def test_an_answer_with_its_own_cache_control_stays_private() -> None:
    """A signed-in user's stream (`Cache-Control: no-cache`) was not marked private."""
    from cosyserve.api.security_headers import secured

    streamed = dict(secured([(b"cache-control", b"no-cache")], private=True))
    assert streamed[b"cache-control"] == b"no-cache, private"
    assert dict(secured([(b"cache-control", b"no-store")], private=True))[b"cache-control"] == b"no-store"
    assert (
        dict(secured([(b"cache-control", b"max-age=60")], private=False))[b"cache-control"] == b"max-age=60"
    )
