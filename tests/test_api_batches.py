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
    lines[6]["text"] = "这一句太长了" * 10  # 60 characters, the limit is 40: this line alone fails
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
    assert batch["state"] == "done" and (batch["done"], batch["failed"]) == (29, 1), batch
    assert len(seen_progress) > 2  # progress was visible while it ran
    bad = batch["items"][6]
    assert bad["state"] == "failed" and "limit is 40" in bad["error"]["message"]

    archive = client.get(batch["archive_url"])  # signed: no key needed
    assert archive.status_code == 200 and archive.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(archive.content)) as zipped:
        names = zipped.namelist()
        manifest = list(csv.DictReader(io.StringIO(zipped.read("manifest.csv").decode())))
        assert len(manifest) == 30
        wavs = [name for name in names if name.endswith(".wav")]
        assert len(wavs) == 29 and "0001_line1.wav" in wavs and "0007_line7.wav" not in wavs
        for row in manifest:
            if row["state"] != "done":
                assert row["file"] == "" and "limit is 40" in row["error"]
                continue
            audio, rate = sf.read(io.BytesIO(zipped.read(row["file"])))
            assert abs(len(audio) / rate - float(row["duration_s"])) < 0.002, row
            assert row["text"] and row["voice"] == "alice" and row["seed"] == row["name"][4:]
            assert row["subtitles"] in names
    item = client.get(f"/v1/batches/{batch['id']}/items/1", follow_redirects=True)
    assert item.status_code == 200 and item.headers["content-type"] == "audio/wav"
