"""Retakes on the demo model: its takes are scored, fail (its audio is noise), are made again with the next
seeds, and the kept take's seed reproduces it with one take."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import PROMPT_TRANSCRIPT

from cosyserve.errors import InputError
from cosyserve.service.local.synthesizer import Synthesizer
from cosyserve.service.quality import TakePolicy, TakeScores
from cosyserve.service.requests import SynthesisRequest

TEXT = "今天天气很好。"


@pytest.fixture(scope="module")
def synth(demo_model_path: Path) -> Synthesizer:
    return Synthesizer.load(demo_model_path, device="cpu")


def _request(prompt_wav_bytes: bytes, **kwargs) -> SynthesisRequest:
    return SynthesisRequest(text=TEXT, prompt_wav=prompt_wav_bytes, prompt_text=PROMPT_TRANSCRIPT, **kwargs)


def test_one_take_is_scored_and_unchanged(synth, prompt_wav_bytes) -> None:
    result = synth.run(_request(prompt_wav_bytes, seed=3))
    report = result.quality
    assert report is not None and report.takes == 1 and result.seed == 3
    scores = report.scores
    assert scores.similarity is not None and scores.pace_ratio is not None
    assert "noise" in scores.failed  # the demo model speaks noise: the gate sees it
    assert result.stage_seconds["quality"] > 0
    assert result.stage_seconds["quality"] < 0.2 * result.stage_seconds["total"]


def test_failing_takes_are_made_again_and_the_seed_reproduces_the_kept_one(synth, prompt_wav_bytes) -> None:
    result = synth.run(_request(prompt_wav_bytes, seed=10, takes=3))
    assert result.quality is not None and result.quality.takes == 3  # every take failed
    assert result.seed in (10, 11, 12) and not result.quality.scores.passed
    again = synth.run(_request(prompt_wav_bytes, seed=result.seed, takes=1))
    np.testing.assert_array_equal(again.audio, result.audio)
    assert again.quality.scores.failed == result.quality.scores.failed


def test_the_first_passing_take_ends_the_retakes(synth, prompt_wav_bytes, monkeypatch) -> None:
    made: list[int] = []
    original = synth.scorer.score

    def second_passes(take, thresholds=None) -> TakeScores:
        scores = original(take, thresholds)
        made.append(len(made))
        return dataclasses.replace(scores, failed=("noise",) if len(made) == 1 else ())

    monkeypatch.setattr(synth.scorer, "score", second_passes)
    result = synth.run(_request(prompt_wav_bytes, seed=20, takes=4))
    assert len(made) == 2 and result.quality.takes == 2 and result.seed == 21 and result.quality.scores.passed


def test_a_streamed_request_is_scored_never_made_again(synth, prompt_wav_bytes) -> None:
    stream = synth.synthesize(_request(prompt_wav_bytes, seed=5, takes=3, stream=True))
    chunks = list(stream)
    result = stream.result()
    assert chunks and result.quality.takes == 1 and result.seed == 5


def test_takes_out_of_range_and_scores_off(synth, prompt_wav_bytes) -> None:
    with pytest.raises(InputError, match="takes"):
        synth.synthesize(_request(prompt_wav_bytes, takes=9))
    quiet = synth.sharing_model(voices=None, max_text_chars=200, quality=TakePolicy(enabled=False))
    assert quiet.run(_request(prompt_wav_bytes, seed=1)).quality is None


def test_a_requests_own_thresholds_judge_its_takes(synth, prompt_wav_bytes) -> None:
    """A request's `thresholds` replace the server's for it alone: a noise limit of 1 passes the demo
    model's noise, and the next request is judged by the server's again."""
    lenient = synth.run(_request(prompt_wav_bytes, seed=3, thresholds={"max_flatness": 1.0}))
    assert "noise" not in lenient.quality.scores.failed
    assert "noise" in synth.run(_request(prompt_wav_bytes, seed=3)).quality.scores.failed
    with pytest.raises(InputError, match="min_pace_ratio 3 is above max_pace_ratio 2"):
        synth.synthesize(_request(prompt_wav_bytes, thresholds={"min_pace_ratio": 3.0}))
    with pytest.raises(InputError, match="unknown quality threshold 'min_loudness'"):
        synth.synthesize(_request(prompt_wav_bytes, thresholds={"min_loudness": 3.0}))
