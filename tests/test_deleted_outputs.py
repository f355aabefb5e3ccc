"""An output deleted through one node of a cluster leaves no copy on another (found by a team's run: the
worker that made a deleted result kept its audio on disk until retention). Tombstones in a real
redis-server; each node's outputs in its own directory."""

from __future__ import annotations

import uuid

import pytest

from cosyserve.errors import OutputNotFound
from cosyserve.service.distributed import deleted_outputs
from cosyserve.service.distributed.deleted_outputs import DeletedOutputs, DeletedOutputSweep
from cosyserve.service.distributed.relay import connect
from cosyserve.service.stores.outputs import OutputStore


@pytest.fixture
def tombstones(redis_url, monkeypatch):
    monkeypatch.setattr(deleted_outputs, "KEY", f"test-deleted-{uuid.uuid4().hex}")  # this test's own set
    client = connect(redis_url)
    yield DeletedOutputs(client)
    client.delete(deleted_outputs.KEY)
    client.close()


def test_a_worker_drops_its_copies_of_outputs_deleted_through_an_api_node(tmp_path, tombstones) -> None:
    worker = OutputStore(tmp_path / "worker")
    api = OutputStore(tmp_path / "api")
    api.on_deleted = tombstones.note_quietly
    made = [worker.save(b"RIFF" + bytes([n]) * 64, "wav", {"text": f"line {n}"}) for n in range(3)]
    for output in made[:2]:  # as the bucket lets an API node serve and delete them
        api.save(output.path.read_bytes(), "wav", {})  # a copy of its own
    deleted_here = api.list()[0].id
    api.delete(deleted_here)  # `on_deleted` is called with whatever the node deletes
    assert [output_id for output_id, _ in tombstones.since(0.0)] == [deleted_here]
    for output in made[:2]:
        tombstones.note(output.id)
    sweep = DeletedOutputSweep(tombstones, worker.drop_local)
    assert sweep.sweep() == 2
    for output in made[:2]:
        assert not output.path.exists() and not output.sidecar_path.exists()
        with pytest.raises(OutputNotFound):
            worker.get(output.id)
    assert worker.get(made[2].id).path.exists()  # not deleted: kept
    assert sweep.sweep() == 0  # looked at once; nothing new
    tombstones.note(made[2].id)
    assert sweep.sweep() == 1 and worker.list() == []
    # A worker that starts later looks at every tombstone kept, and has nothing left to drop.
    assert DeletedOutputSweep(tombstones, worker.drop_local).sweep() == 0


def test_tombstones_are_kept_for_a_month(tombstones) -> None:
    now = [1_000_000_000.0]
    clocked = DeletedOutputs(tombstones.client, clock=lambda: now[0])
    clocked.note("output_20260101_000000")
    now[0] += deleted_outputs.KEEP_S + 1
    clocked.note("output_20260201_000000")
    assert [output_id for output_id, _ in clocked.since(0.0)] == ["output_20260201_000000"]


def test_a_node_that_cannot_reach_redis_still_deletes(tmp_path) -> None:
    unreachable = DeletedOutputs(connect("redis://127.0.0.1:1/0"))
    store = OutputStore(tmp_path / "api")
    store.on_deleted = unreachable.note_quietly
    output = store.save(b"RIFF" + b"\0" * 64, "wav", {})
    store.delete(output.id)  # logged, not raised: the worker's copy then goes at retention
    assert not output.path.exists()
