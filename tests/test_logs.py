"""Logging: request ids on every record, text and JSON lines, the ring buffer, failure records."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest

from cosyserve.errors import JobTimeout
from cosyserve.service.logs import (
    RingBufferHandler,
    clear_recent_logs,
    configure_logging,
    get_request_id,
    log_failure,
    recent_logs,
    request_context,
)


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    clear_recent_logs()
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    clear_recent_logs()


def test_text_lines_carry_request_id_and_fields(restore_root: None) -> None:
    out = io.StringIO()
    configure_logging("INFO", json=False, stream=out)
    log = logging.getLogger("cosyserve.test")
    log.info("outside")
    with request_context("req-123") as request_id:
        assert request_id == get_request_id() == "req-123"
        log.info("inside %s", "args", extra={"job_id": "j1"})
    log.debug("hidden below INFO")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "[-] outside" in lines[0]
    assert "[req-123] inside args job_id=j1" in lines[1]
    assert get_request_id() is None


def test_json_lines(restore_root: None) -> None:
    out = io.StringIO()
    configure_logging("debug", json=True, stream=out)
    configure_logging("DEBUG", json=True, stream=out)  # again: no duplicate handlers
    with request_context() as request_id:
        logging.getLogger("cosyserve.x").warning("careful", extra={"n": 3, "message_id": object()})
    (line,) = out.getvalue().splitlines()
    record = json.loads(line)
    assert (
        record["level"] == "WARNING" and record["logger"] == "cosyserve.x" and record["message"] == "careful"
    )
    assert record["request_id"] == request_id and len(request_id) == 16
    assert record["n"] == 3 and isinstance(record["message_id"], str)
    assert record["ts"].endswith("+00:00")


def test_request_ids_do_not_leak_between_threads(restore_root: None) -> None:
    configure_logging("INFO", stream=io.StringIO())

    def worker(name: str) -> None:
        with request_context(name):
            logging.getLogger("cosyserve.t").info("from %s", name)

    threads = [threading.Thread(target=worker, args=(f"r{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {(e["request_id"], e["message"]) for e in recent_logs(10)} == {
        (f"r{i}", f"from r{i}") for i in range(4)
    }


def test_ring_buffer_limit_and_level() -> None:
    ring = RingBufferHandler(capacity=5)
    log = logging.getLogger("cosyserve.ring")
    log.propagate, log.level = False, logging.DEBUG
    log.addHandler(ring)
    try:
        for i in range(8):
            log.log(logging.ERROR if i % 2 else logging.INFO, "line %d", i)
    finally:
        log.removeHandler(ring)
    assert [e["message"] for e in ring.recent(100)] == [f"line {i}" for i in range(3, 8)]  # oldest first
    assert [e["message"] for e in ring.recent(2)] == ["line 6", "line 7"]
    assert [e["message"] for e in ring.recent(10, level="error")] == ["line 3", "line 5", "line 7"]
    with pytest.raises(ValueError, match="unknown log level"):
        ring.recent(10, level="loud")


def test_log_failure(restore_root: None) -> None:
    configure_logging("INFO", stream=io.StringIO())
    log_failure("timeout", "job ran too long", exc=JobTimeout("too long"), job_id="j9", name="clash")
    try:
        raise ZeroDivisionError("boom")
    except ZeroDivisionError as exc:
        log_failure("internal", "unexpected", exc=exc)
    expected, unexpected = recent_logs(2)
    assert expected["level"] == "WARNING" and expected["kind"] == "timeout" and expected["job_id"] == "j9"
    assert expected["name_"] == "clash" and "exc" not in expected  # no traceback for expected failures
    assert unexpected["level"] == "ERROR" and "ZeroDivisionError: boom" in unexpected["exc"]
    assert recent_logs(10, level="ERROR") == [unexpected]


def test_the_console_follows_stderr_as_it_is_now(restore_root: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model-loading thread that logged after a test's captured stderr was closed raised "I/O operation
    on closed file" inside logging; the console writes to the stderr of the moment."""
    first = io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    configure_logging("INFO")
    logging.getLogger("cosyserve.test").warning("before")
    now = io.StringIO()
    monkeypatch.setattr("sys.stderr", now)
    first.close()
    logging.getLogger("cosyserve.test").warning("after")
    assert "after" in now.getvalue()


def test_activity_outlives_a_flood_of_other_lines(restore_root: None) -> None:
    """600 unauthenticated requests pushed every activity line out of the shared ring (the Admin tab's
    "Recent activity" then showed nothing of the syntheses and key changes just made)."""
    from cosyserve.service.logs import recent_activity

    configure_logging("INFO", stream=io.StringIO())
    clear_recent_logs()
    logging.getLogger("cosyserve.activity").info("key_revoke")
    for n in range(1500):
        logging.getLogger("cosyserve.access").info("GET /v1/voices 401 %d", n)
    assert [entry["message"] for entry in recent_activity()] == ["key_revoke"]
    assert "key_revoke" not in [entry["message"] for entry in recent_logs(1000)]


def test_uvicorns_colour_copy_of_a_message_is_not_a_field(restore_root: None) -> None:
    out = io.StringIO()
    configure_logging("INFO", json=False, stream=out)
    coloured = "Started server process [\x1b[36m%d\x1b[0m]"
    uvicorn = logging.getLogger("uvicorn.error")
    uvicorn.info("Started server process [%d]", 42, extra={"color_message": coloured})
    line = out.getvalue()
    assert "Started server process [42]" in line and "\x1b" not in line and "color_message" not in line


FORGED = "2026-12-07 23:59:59,000 INFO    cosyserve.activity [0d7de75574d24122] login ok who=boss"


def test_a_client_cannot_write_a_line_of_its_own_into_the_text_log(restore_root: None) -> None:
    """A path or a user name with a line break (or a terminal escape) printed a forged line: every
    record is one line now, its control characters escaped; a traceback still follows its line."""
    out = io.StringIO()
    configure_logging("INFO", json=False, stream=out)
    log = logging.getLogger("cosyserve.access")
    log.info("GET /v1/x\n%s\x1b[31m 404", FORGED, extra={"who": "eve\r\n" + FORGED, "n": 3})
    try:
        raise JobTimeout("slow")
    except JobTimeout:
        log.exception("failed\u2028" + FORGED)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and not any(line.startswith("2026-12-07 23:59:59") for line in lines)
    assert "GET /v1/x\\n2026-12-07" in lines[0] and "\\x1b[31m 404" in lines[0]
    assert "who=eve\\r\\n2026" in lines[0] and lines[0].endswith(" n=3")
    assert "failed\\u2028" in lines[1] and lines[2] == "Traceback (most recent call last):"


def test_forged_lines_reach_neither_the_log_nor_the_admin_tab(restore_root: None, start_api_server) -> None:
    """The same through a live server: a raw request line and a sign-in's user name."""
    from cosyserve.ui.admin_tab import logs_text

    out = io.StringIO()
    server = start_api_server(ui_username="admin", ui_password="correct horse")
    configure_logging("INFO", json=False, stream=out)
    try:
        with server.client() as client:
            client.get("/v1/x%0a" + FORGED.replace(" ", "%20") + "%1b[31m")
            client.post("/auth/login", json={"username": "x\n" + FORGED[:50], "password": "no"})
    finally:
        server.stop()
    lines = out.getvalue().splitlines()
    assert any("/v1/x\\n2026-12-07" in line for line in lines), lines
    # a name that is not the UI's (a password typed into the name field) is not written down
    assert any("who=(another name)" in line for line in lines) and not any("who=x" in line for line in lines)
    assert not any(line.startswith(("2026-12-07 23:59", "\x1b")) for line in lines), lines
    shown = logs_text(recent_logs(200)).splitlines()
    assert not any(FORGED[:30] in line and not line.startswith("20") for line in shown)
    assert not any(line.startswith("2026-12-07 23:59") for line in shown)
