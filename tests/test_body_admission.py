"""A large request body takes the shared receiving budget only once its credentials let it in, and gives
it back when it stops arriving (a team's run: three idle connections without a key held the whole budget,
and every upload over 1 MB waited 30 s for a 503, for as long as they stayed open)."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI, Request

from cosyserve.api import middleware
from cosyserve.api.body_budget import BodyBudget
from cosyserve.api.errors import install_error_handlers
from cosyserve.api.middleware import ApiMiddleware
from cosyserve.service.metrics import Metrics

BIG = 2_000_000  # over the budget's small-body threshold


def app_with(budget: BodyBudget) -> ApiMiddleware:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/up")
    async def up(request: Request) -> dict:
        return {"bytes": len(await request.body())}

    return ApiMiddleware(
        app,
        Metrics(system=False),
        upload_limit_bytes=10_000_000,
        body_budget=budget,
        admit=lambda headers: headers.get("x-api-key") == "good",
    )


async def call(
    app: ApiMiddleware, key: str | None, parts: list[bytes], stall: bool = False
) -> tuple[int, int]:
    """(status, body parts read) of a POST /up sending `parts` (then nothing more, when `stall`)."""
    headers = [(b"content-length", str(BIG).encode())]
    if key:
        headers.append((b"x-api-key", key.encode()))
    scope = {"type": "http", "method": "POST", "path": "/up", "headers": headers, "query_string": b""}
    read = 0

    async def receive() -> dict:
        nonlocal read
        if read < len(parts):
            read += 1
            more = stall or read < len(parts)
            return {"type": "http.request", "body": parts[read - 1], "more_body": more}
        await asyncio.sleep(3600)  # a client that went quiet
        return {"type": "http.disconnect"}

    statuses: list[int] = []

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await asyncio.wait_for(app(scope, receive, send), 10)
    return statuses[0], read


def test_a_large_body_without_credentials_is_refused_before_it_is_read() -> None:
    budget = BodyBudget(3 * BIG)
    app = app_with(budget)
    status, read = asyncio.run(call(app, None, [b"x"]))
    assert status == 401 and read == 0 and budget.in_use == 0
    status, read = asyncio.run(call(app, "good", [b"x" * BIG]))
    assert status == 200 and read == 1 and budget.in_use == 0


def test_a_body_that_stops_arriving_gives_its_budget_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(middleware, "BODY_STALL_S", 0.2)
    budget = BodyBudget(3 * BIG)
    status, read = asyncio.run(call(app_with(budget), "good", [b"x"], stall=True))
    assert status == 408 and read == 1 and budget.in_use == 0


def test_a_body_trickling_below_the_rate_floor_gives_its_budget_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three uploads declaring 21 MB and sending 100 bytes every 19 s held the budget 150 s (as long as
    their sender chose), and an admin's 2 MB enrolment got 503 twice."""
    monkeypatch.setattr(middleware, "BODY_STALL_S", 0.05)
    monkeypatch.setattr(middleware, "MIN_BODY_BYTES_PER_S", 1000)
    budget = BodyBudget(3 * BIG)
    app = app_with(budget)
    real_receive_part = middleware.body_part

    async def slowly(receive):  # a byte every 0.04 s: 25 B/s against a floor of 1000
        await asyncio.sleep(0.04)
        return await real_receive_part(receive)

    monkeypatch.setattr(middleware, "body_part", slowly)
    status, read = asyncio.run(call(app, "good", [b"x"] * 20, stall=True))
    assert status == 408 and read < 20 and budget.in_use == 0  # cut off long before its end
    assert middleware.check_body_rate(10_000, 9.0) is None  # fast enough, or still in its first seconds
    assert middleware.check_body_rate(0, 0.04) is None


def test_a_client_that_hangs_up_mid_body_is_no_server_error() -> None:
    """Each such request was a 500 with a 56-line traceback in the log."""
    metrics = Metrics(system=False)
    app = app_with(BodyBudget(3 * BIG))
    app.metrics = metrics
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/up",
        "headers": [(b"content-length", b"100"), (b"x-api-key", b"good")],
        "query_string": b"",
    }
    messages = iter([{"type": "http.request", "body": b"x", "more_body": True}, {"type": "http.disconnect"}])

    async def receive() -> dict:
        return next(messages)

    statuses: list[int] = []

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    asyncio.run(app(scope, receive, send))
    assert statuses == [499]
    assert metrics.requests_total.labels(route="-", status="500")._value.get() == 0
