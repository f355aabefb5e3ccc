"""Batched flow across requests (`engine.flow_batching`) and the flow's speed options (`flow_steps`,
guidance off), on the tiny parity model: batched mels equal the unbatched ones, the defaults stay the
exact path bit for bit, and the options work one-shot and streaming."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cosyserve.engine.decode_batching import BatchError
from cosyserve.engine.flow_batching import FlowBatcher, batched_flow_mels
from cosyserve.engine.flow_options import flow_options_label, measure_flow_options, probe_mel
from cosyserve.engine.loading import load_hift
from cosyserve.engine.token2wav import FlowPrompt, Token2Wav
from cosyserve.errors import InputError
from cosyserve.model.flow import CausalFlow
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity import token2wav as token2wav_parity


@pytest.fixture(scope="module")
def prompt(tiny_dir: Path) -> FlowPrompt:
    return token2wav_parity.fixture_prompt(tiny_dir)


@pytest.fixture(scope="module")
def jobs(prompt: FlowPrompt, flow: CausalFlow) -> list[tuple[torch.Tensor, FlowPrompt]]:
    """Three requests: different token counts and different prompts (lengths, mels, speakers)."""
    generator = torch.Generator().manual_seed(5)
    vocab = flow.config.vocab_size

    def tokens(count: int) -> torch.Tensor:
        return torch.randint(0, vocab, (1, count), generator=generator)

    other = FlowPrompt(
        speech_token=tokens(12),
        speech_feat=torch.randn(1, 24, 80, generator=generator) * 2 - 5,
        embedding=torch.randn(1, 192, generator=generator),
    )
    short = FlowPrompt(prompt.speech_token[:, :30], prompt.speech_feat[:, :55], prompt.embedding * 0.5)
    return [(tokens(40), prompt), (tokens(9), other), (tokens(23), short)]


def _alone(flow: CausalFlow, tokens: torch.Tensor, prompt: FlowPrompt, **options) -> torch.Tensor:
    return flow.inference(
        tokens, prompt.speech_token, prompt.speech_feat, prompt.embedding, streaming=False, **options
    )


@pytest.mark.parametrize("options", [{}, {"n_timesteps": 4, "guidance": False}])
def test_batched_flow_equals_each_request_alone(flow: CausalFlow, jobs, options) -> None:
    expected = [_alone(flow, tokens, prompt, **options) for tokens, prompt in jobs]
    got = batched_flow_mels(flow, jobs, **options)
    assert [m.shape for m in got] == [m.shape for m in expected]
    assert max(float((g - e).abs().max()) for g, e in zip(got, expected, strict=True)) <= 1e-5
    assert batched_flow_mels(flow, []) == []


def test_flow_batcher_groups_concurrent_calls(flow: CausalFlow, jobs) -> None:
    import threading

    expected = [_alone(flow, tokens, prompt) for tokens, prompt in jobs]
    batcher = FlowBatcher(flow, max_batch=3, window_s=2.0)
    results: list = [None] * 3
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, batcher.mel(*jobs[i]))) for i in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert (batcher.batches, batcher.rows) == (1, 3)
    assert max(float((g - e).abs().max()) for g, e in zip(results, expected, strict=True)) <= 1e-5
    with pytest.raises(InputError):  # checked in the caller's thread: never fails the others' batch
        batcher.mel(torch.full((1, 5), flow.config.vocab_size), jobs[0][1])


def test_flow_batcher_failure_reaches_the_caller(flow: CausalFlow, jobs, monkeypatch) -> None:
    batcher = FlowBatcher(flow)
    monkeypatch.setattr(batcher, "run_batch", lambda items: 1 / 0)
    with pytest.raises(BatchError) as raised:
        batcher.mel(*jobs[1])
    assert isinstance(raised.value.__cause__, ZeroDivisionError)


def test_token2wav_with_batch_flow_matches(model_dir: ModelDir, flow: CausalFlow, jobs) -> None:
    hift = load_hift(model_dir)
    plain, batched = Token2Wav(flow, hift), Token2Wav(flow, hift, batch_flow=True)
    assert batched.flow_batcher is not None and plain.flow_batcher is None
    tokens, prompt = jobs[1]
    assert float((batched.synthesize(tokens, prompt) - plain.synthesize(tokens, prompt)).abs().max()) <= 1e-4


def test_defaults_are_the_exact_path_bit_for_bit(model_dir: ModelDir, flow: CausalFlow, jobs) -> None:
    tokens, prompt = jobs[0]
    default = _alone(flow, tokens, prompt)
    assert torch.equal(_alone(flow, tokens, prompt, n_timesteps=10, guidance=True), default)
    hift = load_hift(model_dir)
    exact = Token2Wav(flow, hift)
    explicit = Token2Wav(flow, hift, flow_steps=10, guidance=True)
    assert exact.exact and explicit.exact
    assert torch.equal(explicit.synthesize(tokens, prompt), exact.synthesize(tokens, prompt))
    assert not Token2Wav(flow, hift, flow_steps=4).exact and not Token2Wav(flow, hift, guidance=False).exact


def test_speed_options_change_the_mel_and_are_reported(flow: CausalFlow, jobs) -> None:
    tokens, prompt = jobs[0]
    exact = _alone(flow, tokens, prompt)
    for options in ({"n_timesteps": 4}, {"guidance": False}, {"n_timesteps": 4, "guidance": False}):
        assert not torch.allclose(_alone(flow, tokens, prompt, **options), exact, atol=1e-3)
    reference = probe_mel(flow)
    same = measure_flow_options(reference, flow, 10, False, "exact")
    assert same.max_abs_mel == 0.0
    deviation = measure_flow_options(reference, flow, 4, True, "exact")
    assert deviation.max_abs_mel > 0 and deviation.to_dict()["flow_steps"] == 4
    assert "NOT the exact path" in flow_options_label(4, True)
    assert "(exact)" in flow_options_label(10, False)


@pytest.mark.parametrize(("steps", "guidance"), [(4, True), (10, False)])
def test_streaming_with_options_reuse_equals_recompute(
    model_dir: ModelDir, flow: CausalFlow, prompt: FlowPrompt, steps: int, guidance: bool
) -> None:
    """The reusing stream (cached K/V, one row per step without guidance) equals the recomputing one."""
    hift = load_hift(model_dir)
    tokens = torch.randint(0, flow.config.vocab_size, (1, 70), generator=torch.Generator().manual_seed(2))
    options = {"flow_steps": steps, "guidance": guidance}
    reuse = Token2Wav(flow, hift, **options)
    recompute = Token2Wav(flow, hift, reuse=False, **options)
    cache = reuse.prepare_prompt(prompt)
    assert cache.flow_prefix.n_timesteps == steps and cache.flow_prefix.guidance == guidance
    got = torch.cat(reuse.stream(tokens, prompt, cache))
    expected = torch.cat(recompute.stream(tokens, prompt))
    assert got.shape == expected.shape and float((got - expected).abs().max()) <= 1e-4
    # A prompt cache made with other options cannot be continued.
    with pytest.raises(InputError, match=r"guidance|steps"):
        Token2Wav(flow, hift).stream(tokens, prompt, cache)


def test_bad_flow_steps(flow: CausalFlow, model_dir: ModelDir) -> None:
    with pytest.raises(InputError, match="flow_steps"):
        Token2Wav(flow, load_hift(model_dir), flow_steps=0)
