"""One user cannot fill the page's event queue: past `MAX_WAITING_PER_USER` waiting events their next
join is refused with a message, while another user's joins go on (over HTTP, the queue not started, so
that every joined event stays waiting)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from fastapi.testclient import TestClient

from cosyserve.ui.event_cap import MAX_WAITING_PER_USER, cap_waiting_events, waiting_events


def no_model(_settings, _voices):
    raise RuntimeError("no model in this test")


def test_one_user_cannot_fill_the_event_queue(tmp_path):
    from cosyserve.api.app import create_app
    from cosyserve.service.assembly import Service
    from cosyserve.service.settings import Settings
    from cosyserve.ui.app import mount_ui

    settings = Settings(model="demo", device="cpu", data_dir=tmp_path / "data",
                        signing_secret="test-signing-secret-0123456789abcdef")  # fmt: skip
    service = Service(settings, synthesizer_factory=no_model)
    keys = {name: service.keys.create(name, role="user")[1] for name in ("alice", "bob")}
    app = create_app(service)
    demo = mount_ui(app, service)
    fn_index = next(index for index, fn in demo.fns.items() if fn.queue)
    client = TestClient(app)  # no lifespan: Gradio's queue is not started, so joined events wait

    def join(who: str, session: str):
        return client.post(
            "/gradio_api/queue/join",
            json={"data": [], "fn_index": fn_index, "session_hash": session},
            headers={"Authorization": f"Bearer {keys[who]}"},
        )

    for number in range(MAX_WAITING_PER_USER):
        assert join("alice", f"a{number % 3}").status_code == 200  # three tabs of hers
    refused = join("alice", "a0")
    assert refused.status_code == 503
    assert "actions waiting" in refused.json()["detail"]
    assert join("bob", "b0").status_code == 200  # the other user's click still queues
    counts = waiting_events(demo._queue)
    assert sorted(counts.values()) == [1, MAX_WAITING_PER_USER]


def test_concurrent_joins_do_not_overshoot_the_cap():
    """Pushes that await before their event is queued count against the cap while they run."""
    queued: list = []
    queue = SimpleNamespace(event_queue_per_concurrency_id={"fn": SimpleNamespace(queue=queued)})

    async def slow_push(body, request, username):
        await asyncio.sleep(0.01)  # Gradio's push awaits its locks and validators before queueing
        queued.append(SimpleNamespace(request=request))
        return True, "event", "success"

    queue.push = slow_push
    cap_waiting_events(SimpleNamespace(_queue=queue), limit=3)
    alice = SimpleNamespace(state=SimpleNamespace(cosyserve_event_owner="key:1"))

    async def flood():
        return await asyncio.gather(
            *(queue.push(body=None, request=alice, username="alice") for _ in range(10))
        )

    results = asyncio.run(flood())
    assert [ok for ok, _, _ in results].count(True) == 3
    assert len(queued) == 3
