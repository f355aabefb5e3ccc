"""`cosyserve batch` and `cosyserve dub`, locally with the demo model and against a running server:
files and manifest, failing lines reported with a non-zero status, `--resume` making only what is missing,
and the server path following (not resubmitting) its batch."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import soundfile as sf

from conftest import PROMPT_TRANSCRIPT, enrol_voice
from cosyserve.cli import main as cli_main

SCRIPT = "text,name,seed\n第一句。,one,1\n第2课。,two,2\n" + "太长" * 30 + ",bad,3\n第四句。,four,4\n"
SRT = (
    "1\n00:00:00,500 --> 00:00:02,000\n第一句。\n\n"
    "2\n00:00:03,000 --> 00:00:03,800\n这一句话非常非常长，长到无论如何都放不进它的时间里去。\n\n"
    "3\n00:00:05,000 --> 00:00:06,500\n好。\n"
)


@pytest.fixture
def prompt_args(shared_dir: Path, demo_model_path: Path, tmp_path: Path) -> list[str]:
    prompt = shared_dir / "audio" / "prompt_zh_24k.wav"
    return [
        "--model", str(demo_model_path), "--device", "cpu", "--threads", "1",
        "--data-dir", str(tmp_path / "data"), "--prompt-wav", str(prompt), "--prompt-text", PROMPT_TRANSCRIPT,
        "--max-chars", "40", "--quiet",
    ]  # fmt: skip


def manifest(out: Path) -> list[dict]:
    with (out / "manifest.csv").open(encoding="utf-8") as source:
        return list(csv.DictReader(source))


def test_a_local_batch_resumes_where_it_stopped(tmp_path, prompt_args, capsys) -> None:
    script = tmp_path / "script.csv"
    script.write_text(SCRIPT, encoding="utf-8")
    out = tmp_path / "out"
    assert cli_main(["batch", str(script), "--out", str(out), *prompt_args]) == 1  # one line failed
    assert "3 of 4 items made" in capsys.readouterr().err
    rows = manifest(out)
    assert [row["state"] for row in rows] == ["done", "done", "failed", "done"]
    assert "limit is 40" in rows[2]["error"]
    for row in rows:
        if row["file"]:
            audio, rate = sf.read(out / row["file"])
            assert abs(len(audio) / rate - float(row["duration_s"])) < 0.002
    assert cli_main(["batch", str(script), "--out", str(out), *prompt_args]) == 2  # results there: refused
    assert "pass --resume" in capsys.readouterr().err

    kept = (out / "0001_one.wav").stat().st_mtime_ns
    (out / "0002_two.wav").unlink()
    assert cli_main(["batch", str(script), "--out", str(out), "--resume", *prompt_args]) == 1
    assert (out / "0002_two.wav").exists() and (out / "0001_one.wav").stat().st_mtime_ns == kept
    assert [row["seed"] for row in manifest(out)] == ["1", "2", "", "4"]
    assert "\n第2课。\n" in (out / "0002_two.srt").read_text(encoding="utf-8")  # typed, not 第二课


def test_takes_for_every_line_and_a_lines_own(tmp_path, prompt_args) -> None:
    """`--takes 2` is every line's; a line's own `takes` and `thresholds` columns win (the demo model's
    noise fails its checks, so a line allowed two takes makes two)."""
    script = tmp_path / "script.csv"
    script.write_text('text,takes,thresholds\n第一句。,,\n第二句。,1,"{""max_flatness"": 1}"\n', "utf-8")
    out = tmp_path / "out"
    args = ["batch", str(script), "--out", str(out), "--takes", "2", "--seed", "1", *prompt_args]
    assert cli_main(args) == 0
    first, second = manifest(out)
    assert (first["takes"], second["takes"]) == ("2", "1")
    assert "noise" in first["take_failed"] and "noise" not in second["take_failed"]


def test_thresholds_for_every_line_and_a_lines_own(tmp_path, prompt_args) -> None:
    """`--quality-max-flatness 1` is every line's (the demo model's noise then passes the noise check); a
    line's own `thresholds` go over it one by one; a value out of range is one line and exit 2."""
    script = tmp_path / "script.csv"
    script.write_text('text,thresholds\n第一句。,\n第二句。,"{""max_flatness"": 0.001}"\n', "utf-8")
    out = tmp_path / "out"
    args = [
        "batch",
        str(script),
        "--out",
        str(out),
        "--seed",
        "1",
        "--quality-max-flatness",
        "1",
        *prompt_args,
    ]
    assert cli_main(args) == 0
    first, second = manifest(out)
    assert "noise" not in first["take_failed"] and "noise" in second["take_failed"]
    assert cli_main([*args[: -len(prompt_args)], "--quality-max-silence-ratio", "7", *prompt_args]) == 2


def test_a_local_dub_leaves_the_track_and_its_report_only(tmp_path, prompt_args) -> None:
    subtitles = tmp_path / "episode.srt"
    subtitles.write_text(SRT, encoding="utf-8")
    track = tmp_path / "episode.flac"
    assert cli_main(["dub", str(subtitles), "--out", str(track), "--seed", "1", *prompt_args]) == 0
    audio, rate = sf.read(track)
    assert abs(len(audio) / rate - 6.5) <= 0.05
    with (tmp_path / "episode.flac.report.csv").open(encoding="utf-8") as source:  # named after the track
        report = list(csv.DictReader(source))
    assert [row["state"] for row in report] == ["done"] * 3
    assert [row["cue"] for row in report] == ["1", "2", "3"]
    assert float(report[1]["speed"]) == pytest.approx(1.25) and float(report[1]["cut_s"]) > 0
    assert float(report[1]["actual_end_s"]) <= 5.0 + 1e-3  # never over the next cue
    played = float(report[1]["played_s"])
    assert played == pytest.approx(float(report[1]["speech_s"]) - float(report[1]["cut_s"]), abs=2e-3)
    assert float(report[1]["overflow_s"]) == pytest.approx(5.0 - 3.8, abs=2e-3)  # only what plays
    # each cue's take scores, as a server's dub report has them (the columns were empty here)
    assert all(
        row["takes"] == "1" and row["take_passed"] in ("yes", "no") and row["similarity"] for row in report
    )
    # nothing else beside the output: no .parts folder, no temp files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "episode.flac", "episode.flac.report.csv",
                                                          "episode.srt"]  # fmt: skip

    wav = tmp_path / "episode.wav"  # a second track of the same file keeps its own report
    assert cli_main(["dub", str(subtitles), "--out", str(wav), "--report", str(tmp_path / "r.json"),
                     "--seed", "1", *prompt_args]) == 0  # fmt: skip
    document = json.loads((tmp_path / "r.json").read_text())
    from cosyserve.service.labels import riff_tags

    produced = json.loads(riff_tags.read(wav.read_bytes()))["ProduceID"]  # as every CLI file is named
    assert re.fullmatch(r"local-[0-9a-f]{16}", produced), produced  # it was "local-episode.wav"
    assert len(document["cues"]) == 3 and document["reordered"] is False and document["track_s"] == 6.5
    assert not (tmp_path / "episode.wav.parts").exists() and (tmp_path / "episode.flac.report.csv").exists()


def test_a_failed_local_dub_keeps_its_cues_for_resume(tmp_path, prompt_args, capsys) -> None:
    subtitles = tmp_path / "episode.srt"
    subtitles.write_text(SRT.replace("好。", "太长" * 30), encoding="utf-8")  # longer than --max-chars 40
    track = tmp_path / "episode.wav"
    assert cli_main(["dub", str(subtitles), "--out", str(track), "--seed", "1", *prompt_args]) == 1
    assert "1 of 3 cues failed" in capsys.readouterr().err
    parts = tmp_path / "episode.wav.parts"
    assert track.exists() and parts.is_dir()
    assert json.loads((parts / "cue0003.json").read_text())["state"] == "failed"
    subtitles.write_text(SRT, encoding="utf-8")  # fixed: --resume makes only the failed cue
    again = ["dub", str(subtitles), "--out", str(track), "--resume", "--seed", "1"]
    assert cli_main([*again, *prompt_args]) == 0
    assert not parts.exists() and (tmp_path / "episode.wav.report.csv").exists()
    audio, rate = sf.read(track)
    assert abs(len(audio) / rate - 6.5) <= 0.05


def test_a_dub_longer_than_the_limit_is_refused_in_one_line(tmp_path, prompt_args, capsys) -> None:
    subtitles = tmp_path / "late.srt"
    subtitles.write_text("1\n00:00:01,000 --> 00:00:02,000\n早。\n\n2\n10:00:00,000 --> 10:00:01,000\n晚。\n")
    track = tmp_path / "late.wav"
    assert cli_main(["dub", str(subtitles), "--out", str(track), *prompt_args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("cosyserve dub: error: the dub's track would be")
    assert "10:00:01" in err and "3:00:00" in err and "--max-dub-track-s" in err
    assert not track.exists() and not (tmp_path / "late.wav.parts").exists()


def test_batch_and_dub_against_a_server(tmp_path, start_api_server, prompt_wav_bytes, capsys) -> None:
    live = start_api_server(max_text_chars=40)
    with live.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
    script = tmp_path / "lines.txt"
    script.write_text("第一句。\n第2课。\n", encoding="utf-8")
    out = tmp_path / "out"
    remote = ["--server", live.url, "--voice", "alice", "--quiet"]
    assert cli_main(["batch", str(script), "--out", str(out), *remote]) == 0
    assert sorted(p.name for p in out.glob("*.wav")) == ["0001_第一句.wav", "0002_第2课.wav"]
    assert "\n第2课。\n" in (out / "0002_第2课.srt").read_text(encoding="utf-8")  # from the server's archive
    assert len(manifest(out)) == 2
    assert cli_main(["batch", str(script), "--out", str(out), *remote]) == 2  # submitted before
    assert "pass --resume" in capsys.readouterr().err
    assert cli_main(["batch", str(script), "--out", str(out), "--resume", *remote]) == 0
    assert len(live.service.jobs.list(kinds=("batch",))) == 1  # followed, not submitted again

    subtitles = tmp_path / "episode.vtt"
    subtitles.write_text("WEBVTT\n\n00:00.500 --> 00:02.000\n第一句。\n\n00:03.000 --> 00:04.500\n第二句。\n")
    track = tmp_path / "episode.mp3"
    assert cli_main(["dub", str(subtitles), "--out", str(track), *remote]) == 0
    audio, rate = sf.read(track)
    assert abs(len(audio) / rate - 4.5) <= 0.1  # mp3 frames pad a little
    assert (tmp_path / "episode.mp3.report.csv").read_text().count("\n") == 3
    assert not list(tmp_path.glob(".episode*"))  # the download went to a temp file, moved into place
    assert (
        cli_main(["batch", str(script), "--out", str(tmp_path / "x"), "--server", "http://127.0.0.1:9"]) == 3
    )
    assert "could not be reached" in capsys.readouterr().err
    # what the server refuses as input ends as a local run ends on it: exit 2, not 1
    elsewhere = ["--server", live.url, "--voice", "nobody", "--quiet"]
    assert cli_main(["batch", str(script), "--out", str(tmp_path / "y"), *elsewhere]) == 2
    assert "404" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()  # no empty folder left
    live.stop()


def test_an_unknown_voice_stops_a_local_batch_or_dub_before_any_item(
    tmp_path, demo_model_path, capsys
) -> None:
    """Every item failed with it and a manifest was left, so the next run asked for --resume."""
    lines = tmp_path / "lines.txt"
    lines.write_text("第一句。\n第二句。\n", encoding="utf-8")
    subtitles = tmp_path / "episode.srt"
    subtitles.write_text(SRT, encoding="utf-8")
    (tmp_path / "data").mkdir()  # a library without that voice (a missing folder is said as such)
    common = ["--model", str(demo_model_path), "--device", "cpu", "--threads", "1", "--quiet",
              "--data-dir", str(tmp_path / "data"), "--voice", "ghost"]  # fmt: skip
    assert cli_main(["batch", str(lines), "--out", str(tmp_path / "out"), *common]) == 2
    assert cli_main(["dub", str(subtitles), "--out", str(tmp_path / "dub.wav"), *common]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 2 and all("ghost" in line for line in errors), errors
    assert errors[0].startswith("cosyserve batch: error:") and errors[1].startswith("cosyserve dub: error:")
    assert not (tmp_path / "out" / "manifest.csv").exists() and not (tmp_path / "dub.wav.parts").exists()
