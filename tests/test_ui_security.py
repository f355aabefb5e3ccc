"""The UI's front door over HTTP (no browser, no model): login, the same credentials as the API, no file
access outside Gradio's own uploads, upload size limits, and the API still answering beside the UI."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

USER, PASSWORD = "admin", "security-test-password"
HTML = {"Accept": "text/html"}


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


def test_without_any_auth_the_page_is_open(tmp_path):
    with make_client(tmp_path) as client:
        assert client.get("/", headers=HTML).status_code == 200
        assert client.get("/login").status_code == 303  # nothing to log in to
