"""Dubbing over HTTP with the demo model: a 12-cue SRT becomes one track as long as the last cue's end,
each cue's speech starting at its cue (energy onset within 20 ms), over-long cues sped up by the model,
reported, and never run over the next cue.

The demo model's audio is noise of random length (fixed by the seed), so timing is measured as the onset
of noise after silence; two cues carry a text far too long for their slot, one followed by a long gap
(its overflow fits there) and one by the next cue a second later (it must be cut there).
"""

from __future__ import annotations

import io
import itertools
import time

import numpy as np
import pytest
import soundfile as sf

from conftest import enrol_voice

LONG = "这一句话非常非常长，长到无论如何都放不进它的时间里去。"
CUES = [  # (start, end, text)
    (0.5, 2.5, "第一句。"),
    (3.0, 5.0, "第二句。"),
    (5.5, 7.5, "第三句。"),
    (8.0, 9.0, LONG),  # over-long; 5 s of silence after it
    (14.0, 16.0, "第五句。"),
    (16.5, 18.5, "第六句。"),
    (19.0, 20.0, LONG),  # over-long; the next cue starts 1 s after its end
    (21.0, 23.0, "第八句。"),
    (23.5, 25.5, "第九句。"),
    (26.0, 28.0, "第十句。"),
    (28.5, 30.5, "十一句。"),
    (31.0, 33.0, "十二句。"),
]
ONSET_TOLERANCE_S = 0.020
FRAME_S = 0.001


def srt(cues) -> str:
    def clock(t: float) -> str:
        ms = round(t * 1000)
        return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d},{ms % 1000:03d}"

    return "\n".join(f"{n}\n{clock(a)} --> {clock(b)}\n{text}\n" for n, (a, b, text) in enumerate(cues, 1))


def onset_s(track: np.ndarray, rate: int, search_from: float, start: float) -> float:
    """When noise begins after `search_from`: the first 1 ms frame louder than 20% of the cue's level."""
    level = np.sqrt(np.mean(track[round(start * rate) : round((start + 0.3) * rate)] ** 2))
    frame = round(FRAME_S * rate)
    first = round(search_from * rate)
    for at in range(first, len(track) - frame, frame):
        if np.sqrt(np.mean(track[at : at + frame] ** 2)) > 0.2 * level:
            return at / rate
    raise AssertionError("no onset found")


@pytest.fixture(scope="module")
def dubbed(start_api_server, prompt_wav_bytes):
    live = start_api_server(max_text_chars=60)
    with live.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
        files = {"file": ("episode.srt", srt(CUES).encode(), "application/x-subrip")}
        response = client.post("/v1/dub", data={"voice": "alice", "seed": "1"}, files=files)
        assert response.status_code == 202, response.text
        dub = response.json()
        assert response.headers["location"] == f"/v1/dub/{dub['id']}" and dub["total"] == 12
        deadline = time.monotonic() + 300
        while dub["state"] not in ("done", "failed", "cancelled"):
            assert time.monotonic() < deadline
            time.sleep(0.3)
            dub = client.get(f"/v1/dub/{dub['id']}").json()
        assert dub["state"] == "done", dub
        track, rate = sf.read(io.BytesIO(client.get(dub["track_url"]).content), dtype="float32")
        document = client.get(f"/v1/dub/{dub['id']}/report").json()
        report = document["cues"]
        items = [sf.read(io.BytesIO(client.get(i["url"]).content), dtype="float32")[0] for i in dub["items"]]
        yield {
            "live": live,
            "client": client,
            "dub": dub,
            "track": track,
            "rate": rate,
            "report": report,
            "document": document,
            "items": items,
        }
    live.stop()


def test_the_track_is_as_long_as_the_last_cue(dubbed) -> None:
    assert abs(len(dubbed["track"]) / dubbed["rate"] - CUES[-1][1]) <= 0.050


def test_each_cue_starts_on_time(dubbed) -> None:
    track, rate, report = dubbed["track"], dubbed["rate"], dubbed["report"]
    errors = []
    for n, ((start, _end, _text), row) in enumerate(zip(CUES, report, strict=True)):
        assert row["state"] == "done" and row["actual_start_s"] == pytest.approx(start, abs=1e-3)
        previous_end = report[n - 1]["actual_end_s"] if n else 0.0
        if previous_end >= start - 0.05:  # the cue before it was cut right at this start
            continue
        errors.append(onset_s(track, rate, max(previous_end, start - 0.3), start) - start)
    assert len(errors) >= 10 and max(abs(e) for e in errors) <= ONSET_TOLERANCE_S, errors
    dubbed["onset_errors_ms"] = [round(e * 1000, 1) for e in errors]
    print("onset errors (ms):", dubbed["onset_errors_ms"])


def test_the_track_holds_each_cues_own_audio_where_it_belongs(dubbed) -> None:
    track, rate = dubbed["track"], dubbed["rate"]
    for row, audio in zip(dubbed["report"], dubbed["items"], strict=True):
        start = round(row["actual_start_s"] * rate)
        kept = round(row["played_s"] * rate)
        compare = kept - (round(0.011 * rate) if row["cut_s"] else 0)  # a cut cue fades out at its end
        np.testing.assert_allclose(track[start : start + compare], audio[:compare], atol=1e-4)


def test_over_long_cues_are_sped_up_reported_and_never_run_over_the_next(dubbed) -> None:
    report = dubbed["report"]
    gap_cue, tight_cue = report[3], report[6]
    print(
        "over-long cues:",
        [{k: row[k] for k in ("cue", "speed", "overflow_s", "cut_s")} for row in (gap_cue, tight_cue)],
    )
    for row in (gap_cue, tight_cue):
        assert row["speed"] == pytest.approx(1.25) and row["speedup"] == pytest.approx(1.25)
        assert row["natural_s"] > row["speech_s"] and "sped up 1.25x" in row["adjustments"]
        assert row["overflow_s"] > 0.5
    assert gap_cue["cut_s"] == 0 and gap_cue["actual_end_s"] < CUES[4][0]  # ran into the gap only
    assert gap_cue["played_s"] == gap_cue["speech_s"]
    assert tight_cue["cut_s"] > 0 and tight_cue["actual_end_s"] == pytest.approx(CUES[7][0], abs=1e-3)
    # what was cut is not played: the overflow is what plays past the cue's end, up to the next cue
    assert tight_cue["played_s"] == pytest.approx(tight_cue["speech_s"] - tight_cue["cut_s"], abs=1e-3)
    assert tight_cue["overflow_s"] == pytest.approx(CUES[7][0] - CUES[6][1], abs=1e-3)
    assert "not played" in tight_cue["adjustments"]
    for row, nxt in itertools.pairwise(report):
        assert row["actual_end_s"] <= nxt["planned_start_s"] + 1e-3
    track, rate = dubbed["track"], dubbed["rate"]
    silence = track[round((gap_cue["actual_end_s"] + 0.01) * rate) : round(CUES[4][0] * rate)]
    assert len(silence) and np.max(np.abs(silence)) == 0.0
    items = {i["position"]: i for i in dubbed["dub"]["items"]}
    assert items[4]["overflow_s"] == gap_cue["overflow_s"] and items[7]["cut_s"] == tight_cue["cut_s"]


def test_the_report_and_other_track_formats_download(dubbed) -> None:
    client, dub = dubbed["client"], dubbed["dub"]
    csv_report = client.get(f"/v1/dub/{dub['id']}/report", params={"format": "csv"})
    assert csv_report.status_code == 200 and len(csv_report.text.strip().splitlines()) == 13
    assert csv_report.text.startswith(
        "position,cue,file_position,text,planned_start_s,planned_end_s,actual_start_s,actual_end_s,"
        "speech_s,played_s,cut_s,overflow_s,speed,speedup,natural_s,adjustments,state,error"
    )
    mp3 = client.get(f"/v1/dub/{dub['id']}/track", params={"format": "mp3"}, follow_redirects=True)
    assert mp3.status_code == 200 and mp3.headers["content-type"] == "audio/mpeg"
    flac = client.get(f"/v1/dub/{dub['id']}/track", params={"format": "flac"}, follow_redirects=True)
    audio, rate = sf.read(io.BytesIO(flac.content))
    assert abs(len(audio) / rate - CUES[-1][1]) <= 0.050


def test_the_report_keeps_the_files_numbers_and_the_charge_is_the_track(dubbed) -> None:
    document, dub = dubbed["document"], dubbed["dub"]
    assert document["reordered"] is False and "order_note" not in document
    assert [row["cue"] for row in document["cues"]] == [str(n) for n in range(1, 13)]
    assert document["track_s"] == pytest.approx(CUES[-1][1]) == document["planned_track_s"]
    # no key here, but the job counts what it charged: the track's length, not the speech made
    assert document["charged_s"] == pytest.approx(CUES[-1][1], abs=1e-3)
    assert dub["charged_s"] == pytest.approx(CUES[-1][1], abs=1e-3)
    assert sum(row["played_s"] for row in document["cues"]) < document["charged_s"] - 5  # silence counts


def test_cues_out_of_order_are_placed_in_time_and_the_report_says_so(dubbed) -> None:
    client = dubbed["client"]
    srt_text = (
        "7\n00:00:03,000 --> 00:00:04,000\n后。\n\n"
        "12\n00:00:00,500 --> 00:00:01,500\n前。\n\n"
        "00:00:02,000 --> 00:00:02,500\n中。\n"
    )
    files = {"file": ("shuffled.srt", srt_text.encode(), "application/x-subrip")}
    dub = client.post("/v1/dub", data={"voice": "alice", "seed": "2"}, files=files).json()
    deadline = time.monotonic() + 120
    while dub["state"] not in ("done", "failed", "cancelled"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
        dub = client.get(f"/v1/dub/{dub['id']}").json()
    assert dub["state"] == "done", dub
    document = client.get(f"/v1/dub/{dub['id']}/report").json()
    rows = [(r["position"], r["cue"], r["file_position"], r["planned_start_s"]) for r in document["cues"]]
    # in time order; the file's own numbers kept (the third cue had none: its place in the file)
    assert rows == [(1, "12", 2, 0.5), (2, "3", 3, 2.0), (3, "7", 1, 3.0)]
    assert document["reordered"] is True and "not in time order" in document["order_note"]
    assert [item["cue"] for item in dub["items"]] == ["12", "3", "7"]


def test_a_track_longer_than_the_limit_is_refused_at_submit(dubbed) -> None:
    client = dubbed["client"]
    late = "1\n00:00:01,000 --> 00:00:02,000\n早。\n\n2\n10:00:00,000 --> 10:00:01,000\n晚。\n"
    files = {"file": ("late.srt", late.encode(), "application/x-subrip")}
    response = client.post("/v1/dub", data={"voice": "alice"}, files=files)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    assert "10:00:01" in error["message"] and "3:00:00" in error["message"]
    assert "max_dub_track_s" in error["message"] and "COSYSERVE_MAX_DUB_TRACK_S" in error["message"]


def test_a_long_track_downloads_transcoded_file_to_file(dubbed, monkeypatch) -> None:
    import cosyserve.api.outputs as outputs_api

    monkeypatch.setattr(outputs_api, "IN_MEMORY_LIMIT_BYTES", 0)  # every track counts as long
    client, dub = dubbed["client"], dubbed["dub"]
    flac = client.get(f"/v1/dub/{dub['id']}/track", params={"format": "flac"}, follow_redirects=True)
    assert flac.status_code == 200 and flac.headers["content-type"] == "audio/flac"
    audio, rate = sf.read(io.BytesIO(flac.content), dtype="float32")
    assert rate == dubbed["rate"] and np.array_equal(audio, dubbed["track"])
    root = dubbed["live"].service.outputs.root
    deadline = time.monotonic() + 10  # the temp file goes once the response is sent
    while [p for p in root.iterdir() if p.name.startswith(".")]:
        assert time.monotonic() < deadline, list(root.iterdir())
        time.sleep(0.05)


def test_the_web_ui_refuses_a_track_longer_than_the_limit(dubbed, tmp_path) -> None:
    from types import SimpleNamespace

    from cosyserve.errors import InputError
    from cosyserve.service.access.principals import Principal
    from cosyserve.ui.bridge import BatchBridge

    service = dubbed["live"].service
    late = tmp_path / "late.srt"
    late.write_text("1\n00:00:01,000 --> 00:00:02,000\n早。\n\n2\n10:00:00,000 --> 10:00:01,000\n晚。\n")
    before = len(service.jobs.list(kinds=("dub",)))
    batches = BatchBridge(SimpleNamespace(service=service))  # the Batch tab's calls, without a browser
    with pytest.raises(InputError, match=r"limit of 3:00:00 \(max_dub_track_s"):
        batches.submit(
            Principal("anonymous", "admin"),
            late,
            voice="alice",
            instruct=None,
            fmt="wav",
            max_speed=1.25,
            request_id="ui-test",
        )
    assert len(service.jobs.list(kinds=("dub",))) == before  # nothing was queued


def test_a_cancelled_dubs_track_points_at_its_finished_cues(dubbed) -> None:
    client = dubbed["client"]
    cues = [(n * 3.0, n * 3.0 + 2.0, "很长的一句话，说了又说。") for n in range(40)]
    files = {"file": ("long.srt", srt(cues).encode(), "application/x-subrip")}
    dub = client.post("/v1/dub", data={"voice": "alice"}, files=files).json()
    assert client.delete(f"/v1/dub/{dub['id']}").status_code == 202
    deadline = time.monotonic() + 60
    while client.get(f"/v1/dub/{dub['id']}").json()["state"] != "cancelled":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    refused = client.get(f"/v1/dub/{dub['id']}/track")
    message = refused.json()["error"]["message"]
    assert refused.status_code == 409 and "yet" not in message, message
    assert f"/v1/batches/{dub['id']}/archive" in message
    # its report gives the track made (none), beside the one planned (it gave the planned one as made)
    report = client.get(f"/v1/dub/{dub['id']}/report").json()
    assert report["track_s"] == 0.0 and report["planned_track_s"] == pytest.approx(cues[-1][1])
