"""Tokens → audio: one-shot and streaming against token2wav.npz, per-request stream state, speed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cosyserve.engine.loading import load_flow, load_hift
from cosyserve.engine.token2wav import Token2Wav
from cosyserve.errors import InputError
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity import token2wav as token2wav_parity


@pytest.fixture(scope="module")
def runner(tiny_dir: Path) -> Token2Wav:
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    noise = token2wav_parity.fixture_noise(tiny_dir)
    return Token2Wav(load_flow(model_dir), load_hift(model_dir), source_noise=noise)


@pytest.fixture(scope="module")
def plain_runner(tiny_dir: Path) -> Token2Wav:
    """With the vocoder's own per-process noise (unbounded length), as in normal use."""
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    return Token2Wav(load_flow(model_dir), load_hift(model_dir))


@pytest.fixture(scope="module")
def golden(tiny_dir: Path) -> dict[str, np.ndarray]:
    with np.load(tiny_dir / "token2wav.npz") as data:
        return {key: data[key] for key in data.files}


@pytest.fixture(scope="module")
def prompt(tiny_dir: Path) -> token2wav_parity.FlowPrompt:
    return token2wav_parity.fixture_prompt(tiny_dir)


def test_parity_check_passes(tiny_dir: Path) -> None:
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    results = token2wav_parity.run(model_dir, tiny_dir)
    assert [r.name for r in results] == [
        "token2wav wav_nonstream",
        "token2wav stream_chunk_lens",
        "token2wav wav_stream",
    ]
    assert all(r.passed for r in results), results


@pytest.fixture(scope="module")
def recompute_runner(runner: Token2Wav) -> Token2Wav:
    """The official recomputing schedule (no reuse of earlier chunks' work)."""
    return Token2Wav(runner.flow, runner.hift, source_noise=runner.source_noise, reuse=False)


@pytest.mark.parametrize("reuse", [True, False])
def test_stream_chunks_match_official_schedule(
    runner: Token2Wav, recompute_runner: Token2Wav, prompt, golden, reuse: bool
) -> None:
    tokens = torch.from_numpy(golden["token"]).long()[None]
    chunks = (runner if reuse else recompute_runner).stream(tokens, prompt)
    assert [c.shape[0] for c in chunks] == golden["stream_chunk_lens"].tolist()
    offset = 0
    for chunk in chunks:  # every chunk individually, not only the concatenation
        np.testing.assert_allclose(
            chunk.numpy(), golden["wav_stream"][offset : offset + len(chunk)], atol=1e-4
        )
        offset += len(chunk)


def test_interleaved_streams_equal_each_alone(runner: Token2Wav, prompt, golden) -> None:
    tokens_a = torch.from_numpy(golden["token"]).long()[None]
    tokens_b = torch.flip(tokens_a, dims=[1])[:, :55]
    alone_a, alone_b = runner.stream(tokens_a, prompt), runner.stream(tokens_b, prompt)
    state_a, state_b = runner.start_stream(prompt), runner.start_stream(prompt)
    got_a: list[torch.Tensor] = []
    got_b: list[torch.Tensor] = []
    for end in range(1, tokens_a.shape[1] + 1):  # one token at a time, alternating requests
        got_a += runner.stream_step(state_a, tokens_a[:, :end])
        if end <= tokens_b.shape[1]:
            got_b += runner.stream_step(state_b, tokens_b[:, :end])
    got_a.append(runner.stream_finish(state_a, tokens_a))
    got_b.append(runner.stream_finish(state_b, tokens_b))
    for got, alone in ((got_a, alone_a), (got_b, alone_b)):
        assert len(got) == len(alone)
        for x, y in zip(got, alone, strict=True):
            assert torch.equal(x, y)


def test_hop_state_is_per_request(runner: Token2Wav, prompt, golden) -> None:
    tokens = torch.from_numpy(golden["token"]).long()[None]
    first = [c.shape[0] for c in runner.stream(tokens, prompt)]
    second = [c.shape[0] for c in runner.stream(tokens, prompt)]
    assert first == second  # the official code doubles a hop stored on the shared model instead


def test_deterministic_with_process_noise(plain_runner: Token2Wav, prompt, golden) -> None:
    runner = plain_runner
    tokens = torch.from_numpy(golden["token"]).long()[None]
    assert torch.equal(runner.synthesize(tokens, prompt), runner.synthesize(tokens, prompt))


def test_stream_length_equals_one_shot(runner: Token2Wav, prompt, golden) -> None:
    tokens = torch.from_numpy(golden["token"]).long()[None][:, :47]
    assert torch.cat(runner.stream(tokens, prompt)).shape == runner.synthesize(tokens, prompt).shape


@pytest.mark.parametrize("speed", [0.5, 1.5])
def test_speed_stretches(plain_runner: Token2Wav, prompt, golden, speed: float) -> None:
    tokens = torch.from_numpy(golden["token"]).long()[None]
    frames = tokens.shape[1] * 2
    assert plain_runner.synthesize(tokens, prompt, speed=speed).shape[0] == int(frames / speed) * 480


@pytest.mark.parametrize("speed", [0.0, 3.0, float("nan")])
def test_bad_speed(runner: Token2Wav, prompt, golden, speed: float) -> None:
    tokens = torch.from_numpy(golden["token"]).long()[None]
    with pytest.raises(InputError, match="speed"):
        runner.synthesize(tokens, prompt, speed=speed)


def test_over_300_seconds_is_an_error(runner: Token2Wav, prompt) -> None:
    tokens = torch.zeros(1, 7500, dtype=torch.long)
    with pytest.raises(InputError, match="300 s"):
        runner.synthesize(tokens, prompt)


def test_a_cancel_stops_the_flow_between_its_steps(runner: Token2Wav, prompt, golden, monkeypatch) -> None:
    """A one-shot flow pass and the vocoder ran to their end after a cancel or a timeout, holding the
    engine for up to a minute on a CPU; the solver stops at its next step, the vocoder never starts."""
    from cosyserve.errors import Cancelled
    from cosyserve.model.interrupt import interruptible

    tokens = torch.from_numpy(golden["token"]).long()[None]
    steps: list[int] = []
    estimate = type(runner.flow.decoder).estimate

    def counted(self, *args, **kwargs):
        steps.append(1)
        return estimate(self, *args, **kwargs)

    monkeypatch.setattr(type(runner.flow.decoder), "estimate", counted)
    vocoded: list[int] = []
    monkeypatch.setattr(runner.hift, "inference", lambda *a, **k: vocoded.append(1))
    with pytest.raises(Cancelled), interruptible(lambda: len(steps) >= 2):
        runner.synthesize(tokens, prompt)
    assert len(steps) == 2 and not vocoded  # of its 10 steps
    steps.clear()
    monkeypatch.undo()
    with interruptible(lambda: False):  # not cancelled: the same audio as without a cancel to check
        assert torch.equal(runner.synthesize(tokens, prompt), runner.synthesize(tokens, prompt))
