"""Batches over HTTP with the demo model: a CSV script becomes files and a manifest, bad lines fail alone,
cancel stops the rest, and the same items come as JSON, JSON lines or plain text."""

from __future__ import annotations

import csv
import io
import time
import zipfile

import pytest
import soundfile as sf

from conftest import enrol_voice

TERMINAL = {"done", "failed", "cancelled"}


@pytest.fixture(scope="module")
def server(start_api_server, prompt_wav_bytes):
    live = start_api_server(max_text_chars=40)
    with live.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
    yield live
    live.stop()


@pytest.fixture
def client(server):
    with server.client() as http:
        yield http


def wait_batch(client, batch_id: str, timeout: float = 300.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.get(f"/v1/batches/{batch_id}", params={"limit": 1000}).json()
        if batch["state"] in TERMINAL:
            return batch
        assert time.monotonic() < deadline, f"batch {batch_id} still {batch['state']}"
        time.sleep(0.2)


def csv_script(lines: list[dict]) -> bytes:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=["name", "text", "seed"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(lines)
    return buffer.getvalue().encode()


def test_a_csv_script_becomes_files_and_a_manifest(client) -> None:
    lines = [{"name": f"line{n}", "text": f"第{n}句话。", "seed": n} for n in range(1, 31)]
    files = {"file": ("script.csv", csv_script(lines), "text/csv")}
    response = client.post("/v1/batches", data={"voice": "alice"}, files=files)
    assert response.status_code == 202, response.text
    batch = response.json()
    assert response.headers["location"] == f"/v1/batches/{batch['id']}" and batch["total"] == 30
    seen_progress = set()
    while batch["state"] not in TERMINAL:
        seen_progress.add(batch["done"])
        time.sleep(0.3)
        batch = client.get(f"/v1/batches/{batch['id']}", params={"limit": 1000}).json()
    assert batch["state"] == "done" and (batch["done"], batch["failed"]) == (30, 0), batch
    assert len(seen_progress) > 2  # progress was visible while it ran

    archive = client.get(batch["archive_url"])  # signed: no key needed
    assert archive.status_code == 200 and archive.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(archive.content)) as zipped:
        names = zipped.namelist()
        manifest = list(csv.DictReader(io.StringIO(zipped.read("manifest.csv").decode())))
        wavs = [name for name in names if name.endswith(".wav")]
        assert len(manifest) == 30 and len(wavs) == 30 and "0001_line1.wav" in wavs
        for row in manifest:
            audio, rate = sf.read(io.BytesIO(zipped.read(row["file"])))
            assert abs(len(audio) / rate - float(row["duration_s"])) < 0.002, row  # durations match files
            assert row["text"] and row["voice"] == "alice" and row["seed"] == row["name"][4:]
            assert row["state"] == "done" and row["subtitles"] in names
    item = client.get(f"/v1/batches/{batch['id']}/items/1", follow_redirects=True)
    assert item.status_code == 200 and item.headers["content-type"] == "audio/wav"


def test_a_bad_line_fails_alone(client) -> None:
    lines = [{"name": f"line{n}", "text": f"第{n}句话。", "seed": n} for n in range(1, 6)]
    lines[2]["text"] = "这一句太长了" * 10  # 60 characters, the limit is 40
    files = {"file": ("script.csv", csv_script(lines), "text/csv")}
    batch = wait_batch(client, client.post("/v1/batches", data={"voice": "alice"}, files=files).json()["id"])
    assert batch["state"] == "done" and (batch["done"], batch["failed"]) == (4, 1), batch
    bad = batch["items"][2]
    assert bad["state"] == "failed" and "limit is 40" in bad["error"]["message"]
    with zipfile.ZipFile(io.BytesIO(client.get(batch["archive_url"]).content)) as zipped:
        manifest = list(csv.DictReader(io.StringIO(zipped.read("manifest.csv").decode())))
        assert "0003_line3.wav" not in zipped.namelist()
    assert [row["state"] for row in manifest] == ["done", "done", "failed", "done", "done"]
    assert manifest[2]["file"] == "" and "limit is 40" in manifest[2]["error"]
    # an item's file deleted since: the manifest says it is missing (it said "done" beside no file)
    assert client.delete(f"/v1/outputs/{batch['items'][1]['output_id']}").status_code == 204
    with zipfile.ZipFile(io.BytesIO(client.get(batch["archive_url"]).content)) as zipped:
        manifest = list(csv.DictReader(io.StringIO(zipped.read("manifest.csv").decode())))
    assert [row["state"] for row in manifest] == ["done", "missing", "failed", "done", "done"]
    gone = client.get(f"/v1/batches/{batch['id']}/items/2")  # said so (it was 409 "it has no audio")
    assert gone.status_code == 404 and "deleted or expired" in gone.json()["error"]["message"]
    assert client.get(f"/v1/batches/{batch['id']}/items/99").status_code == 404  # no such item (was 400)
    item = wait_batch(client, batch["id"])["items"][1]  # it no longer points at the deleted file
    assert item["state"] == "done" and item["output_id"] is None and item["url"] is None, item


def test_cancel_stops_the_rest(client, server) -> None:
    lines = "\n".join(f"第{n}句话，稍微长一点。" for n in range(1, 31)).encode()
    files = {"file": ("script.txt", lines, "text/plain")}
    batch = client.post("/v1/batches", data={"voice": "alice"}, files=files).json()
    deadline = time.monotonic() + 120
    while client.get(f"/v1/batches/{batch['id']}").json()["done"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    cancelled = client.delete(f"/v1/batches/{batch['id']}")
    assert cancelled.status_code == 202
    final = wait_batch(client, batch["id"])
    assert final["state"] == "cancelled" and final["error"]["code"] == "cancelled"
    assert 2 <= final["done"] < 30 and final["done"] + final["cancelled"] == 30
    assert {i["error"]["code"] for i in final["items"] if i["state"] == "cancelled"} == {"cancelled"}
    partial = final["partial"]  # what is missing, as a cancelled job says it
    assert partial is not None and partial["segments_done"] == final["done"], final
    missing = [i["position"] for i in final["items"] if i["state"] != "done"]
    assert partial["missing"] == missing and partial["segments_total"] == 30
    time.sleep(1.0)  # nothing runs after the cancel
    assert client.get(f"/v1/batches/{batch['id']}").json()["done"] == final["done"]
    assert server.service.scheduler.stats()["running"] == 0
    again = client.delete(f"/v1/batches/{batch['id']}")
    assert again.status_code == 409 and again.json()["error"]["message"].startswith("batch ")  # not "job"
    assert client.get(final["archive_url"]).status_code == 200  # what finished before still downloads


def test_items_come_as_json_json_lines_or_plain_text(client, caplog) -> None:
    caplog.set_level("INFO", logger="cosyserve.activity")
    body = {
        "voice": "alice",
        "seed": 4,
        "items": ["第一句。", {"text": "第二句。", "name": "two", "format": "mp3"}],
    }
    as_json = client.post("/v1/batches", json=body)
    jsonl = (
        b'{"text": "\xe7\xac\xac\xe4\xb8\x80\xe5\x8f\xa5\xe3\x80\x82"}\n{"text": "hello there."}\nnot json\n'
    )
    as_jsonl = client.post(
        "/v1/batches",
        content=jsonl,
        params={"voice": "alice"},
        headers={"content-type": "application/x-ndjson"},
    )
    as_text = client.post(
        "/v1/batches", data={"voice": "alice"}, files={"file": ("a.txt", b"one.\n\ntwo.\n")}
    )
    finals = [wait_batch(client, r.json()["id"]) for r in (as_json, as_jsonl, as_text)]
    assert [(f["total"], f["done"], f["failed"]) for f in finals] == [(2, 2, 0), (3, 2, 1), (2, 2, 0)]
    assert [i["name"] for i in finals[0]["items"]] == ["第一句", "two"] and finals[0]["items"][0]["seed"] == 4
    assert "line 3 is not valid JSON" in finals[1]["items"][2]["error"]["message"]
    mp3 = client.get(finals[0]["items"][1]["url"])
    assert mp3.headers["content-type"] == "audio/mpeg"
    with zipfile.ZipFile(io.BytesIO(client.get(finals[0]["archive_url"]).content)) as zipped:
        assert {"0001_第一句.wav", "0002_two.mp3", "manifest.csv"} <= set(zipped.namelist())
    listed = [b["id"] for b in client.get("/v1/batches").json()["data"]]
    assert {f["id"] for f in finals} <= set(listed)
    lines = [r for r in caplog.records if getattr(r, "event", None) == "batch"]  # one activity line each
    assert {r.job_id for r in lines} >= {f["id"] for f in finals} and all(r.result == "ok" for r in lines)


@pytest.mark.parametrize(
    ("filename", "content", "message"),
    [
        ("a.csv", b"words,voice\nhi,alice\n", "needs a header row with a `text` column"),
        ("a.csv", b"text,colour\nhi,red\n", "unknown CSV column 'colour'"),
        ("a.csv", "text\nhi\n".encode("utf-16"), "not UTF-8"),
        ("a.txt", b"\n\n", "has no items"),
        ("a.doc", b"hi", "can't tell what kind of batch file"),
        ("a.txt", b"hi\n" * 1001, "the limit is 1000"),
    ],
)
def test_a_batch_file_that_cannot_be_read_is_refused(client, filename, content, message) -> None:
    response = client.post("/v1/batches", data={"voice": "alice"}, files={"file": (filename, content)})
    assert response.status_code == 400 and message in response.json()["error"]["message"], response.text


def test_items_that_cannot_run_fail_alone_with_their_reason(client) -> None:
    items = [
        {"text": "第一句。"},
        {"text": "第二句。", "voice": "nobody"},
        {"text": "第三句。", "seed": "seven"},
        {"text": "。。。"},
        {"text": "第五句。", "speed": 9},
    ]
    final = wait_batch(
        client, client.post("/v1/batches", json={"voice": "alice", "items": items}).json()["id"]
    )
    assert final["state"] == "done" and (final["done"], final["failed"]) == (1, 4)
    errors = [item["error"] and item["error"]["code"] for item in final["items"]]
    assert errors == [None] + ["invalid_input"] * 4
    assert "no voice 'nobody'" in final["items"][1]["error"]["message"]
    messages = [item["error"]["message"] for item in final["items"][2:]]
    assert (
        "not a number" in messages[0] and "nothing to speak" in messages[1] and "out of range" in messages[2]
    )
    before = len(client.get("/v1/batches").json()["data"])
    unknown = client.post("/v1/batches", json={"voice": "nobody", "items": ["hi."]})  # the batch's voice
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "voice_not_found", unknown.text
    assert len(client.get("/v1/batches").json()["data"]) == before  # refused at submit: nothing recorded
    no_voice = wait_batch(client, client.post("/v1/batches", json={"items": ["hi."]}).json()["id"])
    assert (no_voice["state"], no_voice["error"]["code"]) == ("failed", "items_failed")
    assert "no voice" in no_voice["items"][0]["error"]["message"]
