"""The finished pieces of a long-text job kept for an attempt that follows a crash (`stores.job_pieces`)."""

from __future__ import annotations

import numpy as np
import pytest

from cosyserve.service.outcomes import SentenceTiming, SynthesisResult
from cosyserve.service.stores.job_pieces import JobPieces

JOB = "0" * 32
PIECES = ["第一句。", "第二句。", "第三句。"]


def result(value: float) -> SynthesisResult:
    audio = np.full(2400, value, dtype=np.float32)
    return SynthesisResult(audio, 24000, 7, [SentenceTiming(0, "第一句。", 0.0, 0.1)], speech_tokens=3)


def test_pieces_come_back_as_made_in_order(tmp_path) -> None:
    store = JobPieces(tmp_path)
    for index in range(2):
        store.save(JOB, index, PIECES[index], "model-a", result(index / 10), charged_s=0.1)
    kept = store.kept(JOB, PIECES, "model-a")
    assert [k.result.audio[0] for k in kept] == pytest.approx([0.0, 0.1])
    assert [k.charged_s for k in kept] == [0.1, 0.1] and kept[1].result.seed == 7
    assert kept[0].result.timings == [SentenceTiming(0, "第一句。", 0.0, 0.1)]


def test_a_piece_for_another_text_or_model_starts_the_job_over_from_there(tmp_path) -> None:
    """A server upgraded between attempts may cut the text otherwise, or load another model: audio made
    for something else is never spliced in."""
    store = JobPieces(tmp_path)
    for index in range(3):
        store.save(JOB, index, PIECES[index], "model-a", result(0.5), charged_s=0.1)
    assert store.kept(JOB, PIECES, "model-b") == []
    assert not any((tmp_path / ".job-pieces" / JOB).iterdir())  # what cannot be used is removed
    for index in range(3):
        store.save(JOB, index, PIECES[index], "model-a", result(0.5), charged_s=0.1)
    assert len(store.kept(JOB, ["第一句。", "另一句。", "第三句。"], "model-a")) == 1


def test_a_damaged_or_unfinished_piece_ends_the_run(tmp_path) -> None:
    store = JobPieces(tmp_path)
    for index in range(3):
        store.save(JOB, index, PIECES[index], "model-a", result(0.5), charged_s=0.1)
    (tmp_path / ".job-pieces" / JOB / "1.json").write_text("{not json")
    assert len(store.kept(JOB, PIECES, "model-a")) == 1
    assert sorted(p.name for p in (tmp_path / ".job-pieces" / JOB).iterdir()) == ["0.json", "0.npy"]


def test_ended_jobs_lose_their_pieces_and_bad_ids_touch_nothing(tmp_path) -> None:
    store = JobPieces(tmp_path)
    other = "1" * 32
    for job in (JOB, other):
        store.save(job, 0, PIECES[0], "m", result(0.5), charged_s=0.1)
    assert store.sweep(lambda job_id: job_id == other) == 1
    assert store.kept(JOB, PIECES, "m") == [] and len(store.kept(other, PIECES, "m")) == 1
    store.save("../escape", 0, PIECES[0], "m", result(0.5), charged_s=0.1)
    assert not (tmp_path / "escape").exists() and store.kept("../escape", PIECES, "m") == []
    store.drop(other)
    assert not (tmp_path / ".job-pieces" / other).exists()


def test_pieces_of_another_seed_and_late_pieces_of_an_ended_job_are_not_kept(tmp_path) -> None:
    """An attempt that lost its job could write a piece with its own seed beside the current attempt's,
    or recreate the folder its job's end had removed."""
    store = JobPieces(tmp_path)
    store.save(JOB, 0, PIECES[0], "m", result(0.5), charged_s=0.1)
    other = SynthesisResult(np.zeros(2400, np.float32), 24000, 8, [SentenceTiming(0, "x", 0.0, 0.1)])
    store.save(JOB, 1, PIECES[1], "m", other, charged_s=0.1)
    assert len(store.kept(JOB, PIECES, "m")) == 1
    store.drop(JOB)
    store.save(JOB, 2, PIECES[2], "m", result(0.5), charged_s=0.1)  # late, after the job ended
    assert not (tmp_path / ".job-pieces" / JOB).exists()
