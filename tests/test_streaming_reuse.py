"""Streaming that reuses work: the flow's frozen prefix (per request and per voice) and incremental
vocoding give the chunks of the official recomputing schedule (token2wav.npz) and of our own
recomputing path, interleaved requests stay independent, and a shared voice cache is never changed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cosyserve.engine.flow_stream import continue_flow
from cosyserve.engine.loading import load_hift
from cosyserve.engine.token2wav import FlowPrompt, PromptCache, PromptCacheStore, Token2Wav
from cosyserve.engine.vocoder_stream import VocoderStream, vocode_increment
from cosyserve.errors import InputError
from cosyserve.model.flow import CausalFlow
from cosyserve.model.hift import HiFTVocoder
from cosyserve.model.hift_stream import decoder_context_frames
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity import token2wav as token2wav_parity

STREAM_TOLERANCE = 1e-4  # the fixture's waveform tolerance
SAME_PATH_TOLERANCE = 2e-5  # reuse against our own recomputing path: float rounding only (the vocoder
# turns mel rounding of ~1e-7 into waveform differences of ~1e-5; the fixture tolerance is 1e-4)


@pytest.fixture(scope="module")
def hift(model_dir: ModelDir) -> HiFTVocoder:
    return load_hift(model_dir)


@pytest.fixture(scope="module")
def golden(tiny_dir: Path) -> dict[str, np.ndarray]:
    with np.load(tiny_dir / "token2wav.npz") as data:
        return {key: data[key] for key in data.files}


@pytest.fixture(scope="module")
def prompt(tiny_dir: Path) -> FlowPrompt:
    return token2wav_parity.fixture_prompt(tiny_dir)


@pytest.fixture(scope="module")
def runners(flow: CausalFlow, hift: HiFTVocoder, tiny_dir: Path) -> dict[str, Token2Wav]:
    noise = token2wav_parity.fixture_noise(tiny_dir)
    return {
        "reuse": Token2Wav(flow, hift, source_noise=noise),
        "recompute": Token2Wav(flow, hift, source_noise=noise, reuse=False),
        "plain_reuse": Token2Wav(flow, hift),
        "plain_recompute": Token2Wav(flow, hift, reuse=False),
    }


@pytest.fixture(scope="module")
def voice(runners: dict[str, Token2Wav], prompt: FlowPrompt) -> PromptCache:
    return runners["reuse"].prepare_prompt(prompt)


def _long_tokens(count: int, seed: int = 3) -> torch.Tensor:
    """Tokens for several chunks of the official schedule (the fixture has one before the last)."""
    return torch.randint(0, 6561, (1, count), generator=torch.Generator().manual_seed(seed))


def _prefix_tensors(cache: PromptCache) -> list[torch.Tensor]:
    prefix = cache.flow_prefix
    return [*(s.kv for s in prefix.segments), prefix.embed_context, prefix.tokens]


def _assert_chunks_close(got: list[torch.Tensor], want: list[torch.Tensor], atol: float) -> None:
    assert [c.shape[0] for c in got] == [c.shape[0] for c in want]
    for index, (x, y) in enumerate(zip(got, want, strict=True)):
        assert (x - y).abs().max().item() <= atol, f"chunk {index}"


@pytest.mark.parametrize("use_voice_cache", [False, True])
def test_reusing_stream_matches_fixture_chunk_by_chunk(
    runners: dict[str, Token2Wav], prompt: FlowPrompt, voice: PromptCache, golden, use_voice_cache: bool
) -> None:
    tokens = torch.from_numpy(golden["token"]).long()[None]
    chunks = runners["reuse"].stream(tokens, prompt, voice if use_voice_cache else None)
    assert [c.shape[0] for c in chunks] == golden["stream_chunk_lens"].tolist()
    offset = 0
    for chunk in chunks:
        expected = golden["wav_stream"][offset : offset + len(chunk)]
        np.testing.assert_allclose(chunk.numpy(), expected, atol=STREAM_TOLERANCE, rtol=0)
        offset += len(chunk)


def test_voice_cache_holds_the_fixed_prompt_chunks(voice: PromptCache, prompt: FlowPrompt, flow) -> None:
    chunk = flow.config.dit.static_chunk_size
    fixed = (prompt.num_tokens - flow.lookahead) * flow.token_mel_ratio  # later tokens cannot change these
    assert voice.frames == fixed // chunk * chunk > 0
    assert voice.nbytes > 0 and voice.flow_prefix.tokens.shape[1] <= prompt.num_tokens


@pytest.fixture(scope="module")
def long_tokens() -> torch.Tensor:
    """Enough tokens for hops 38, 50 and 100 before the last chunk (the fixture has one hop)."""
    return _long_tokens(200)


@pytest.fixture(scope="module")
def recomputed(runners: dict[str, Token2Wav], prompt: FlowPrompt, long_tokens) -> list[torch.Tensor]:
    return runners["plain_recompute"].stream(long_tokens, prompt)


@pytest.mark.parametrize("use_voice_cache", [False, True])
def test_reuse_equals_recomputing_on_a_longer_stream(
    runners, prompt: FlowPrompt, voice: PromptCache, long_tokens, recomputed, use_voice_cache: bool
) -> None:
    assert len(recomputed) == 4
    got = runners["plain_reuse"].stream(long_tokens, prompt, voice if use_voice_cache else None)
    _assert_chunks_close(got, recomputed, SAME_PATH_TOLERANCE)


def test_flow_prefix_continues_the_streaming_flow(flow: CausalFlow, prompt: FlowPrompt) -> None:
    """Each chunk's new frames equal a full streaming pass over prompt + all tokens so far."""
    tokens = _long_tokens(200)
    args = (prompt.speech_token, prompt.speech_feat, prompt.embedding)
    n_prompt = prompt.speech_feat.shape[1]
    prefix, offset = None, 0
    for hop in (38, 50, 100):
        chunk_tokens = tokens[:, : offset + hop + flow.lookahead]
        start = 0 if prefix is None else prefix.frames
        mel, prefix = continue_flow(flow, chunk_tokens, *args, prefix)
        full = flow.inference(chunk_tokens, *args, streaming=True, finalize=False)
        assert prefix.frames == n_prompt + 2 * (offset + hop)  # every chunk of this call is kept
        got = mel[:, :, n_prompt + 2 * offset - start :]
        torch.testing.assert_close(got, full[:, :, 2 * offset :], atol=1e-5, rtol=0)
        offset += hop


def test_changed_tokens_are_rejected(flow: CausalFlow, prompt: FlowPrompt) -> None:
    tokens = _long_tokens(60)
    args = (prompt.speech_token, prompt.speech_feat, prompt.embedding)
    _, prefix = continue_flow(flow, tokens[:, :41], *args)
    changed = tokens.clone()
    changed[0, 5] = (changed[0, 5] + 1) % 6561
    with pytest.raises(InputError, match="tokens differ"):
        continue_flow(flow, changed[:, :58], *args, prefix)
    with pytest.raises(InputError, match="solver steps"):
        continue_flow(flow, tokens[:, :58], *args, prefix, n_timesteps=5)


def test_interleaved_requests_sharing_a_voice_equal_each_alone(
    runners: dict[str, Token2Wav], prompt: FlowPrompt, voice: PromptCache
) -> None:
    runner = runners["plain_reuse"]
    snapshot = [t.clone() for t in _prefix_tensors(voice)]
    tokens_a, tokens_b = _long_tokens(140, seed=1), _long_tokens(90, seed=2)
    alone_a, alone_b = runner.stream(tokens_a, prompt, voice), runner.stream(tokens_b, prompt, voice)
    state_a, state_b = runner.start_stream(prompt, voice), runner.start_stream(prompt, voice)
    got_a: list[torch.Tensor] = []
    got_b: list[torch.Tensor] = []
    for end in range(1, tokens_a.shape[1] + 1):  # one token at a time, alternating requests
        got_a += runner.stream_step(state_a, tokens_a[:, :end])
        if end <= tokens_b.shape[1]:
            got_b += runner.stream_step(state_b, tokens_b[:, :end])
    got_b.append(runner.stream_finish(state_b, tokens_b))
    got_a.append(runner.stream_finish(state_a, tokens_a))
    for got, alone in ((got_a, alone_a), (got_b, alone_b)):
        assert len(got) == len(alone)
        assert all(torch.equal(x, y) for x, y in zip(got, alone, strict=True))
    # The shared voice cache is read-only.
    after = _prefix_tensors(voice)
    assert len(after) == len(snapshot)
    assert all(torch.equal(x, y) for x, y in zip(after, snapshot, strict=True))
    assert state_a.flow_prefix is None and state_b.flow_prefix is None  # freed at the end


def test_memory_limit_bounds_the_prefix_and_keeps_the_output(
    flow: CausalFlow, hift: HiFTVocoder, prompt: FlowPrompt, long_tokens, recomputed
) -> None:
    limit = 6_000_000  # ~20 kB a frame in the tiny flow: room for the first chunk (250 frames) only
    limited = Token2Wav(flow, hift, max_reuse_bytes=limit)
    state = limited.start_stream(prompt)
    got: list[torch.Tensor] = []
    for end in range(1, long_tokens.shape[1] + 1):
        got += limited.stream_step(state, long_tokens[:, :end])
        assert state.flow_prefix is None or state.flow_prefix.nbytes <= limit
    assert state.flow_prefix is not None and 0 < state.flow_prefix.frames < 2 * long_tokens.shape[1]
    got.append(limited.stream_finish(state, long_tokens))
    _assert_chunks_close(got, recomputed, SAME_PATH_TOLERANCE)


def test_voice_cache_pass_and_its_block(
    flow: CausalFlow, hift: HiFTVocoder, prompt: FlowPrompt, voice: PromptCache, monkeypatch
) -> None:
    """The prompt pass covers the fixed frames (the shapes a stream without the cache uses, so both
    round alike), or only the kept chunks when a budget limits them; the kept keys and values are one
    contiguous block per segment."""
    widths: list[int] = []
    estimator = flow.decoder.estimator
    original = estimator.forward_continued

    def recording(x, *args, **kwargs):  # type: ignore[no-untyped-def]
        widths.append(x.shape[2])
        return original(x, *args, **kwargs)

    monkeypatch.setattr(estimator, "forward_continued", recording)
    cache = Token2Wav(flow, hift).prepare_prompt(prompt)
    fixed = (prompt.num_tokens - flow.lookahead) * flow.token_mel_ratio
    assert widths == [fixed] * 10  # one call per solver step
    (segment,) = cache.flow_prefix.segments
    assert segment.kv.shape[5] == cache.frames and segment.kv.is_contiguous()
    assert (
        cache.nbytes
        == flow.prefix_nbytes(cache.frames)
        == segment.nbytes + cache.flow_prefix.embed_context.nbytes
    )
    assert torch.equal(segment.kv, voice.flow_prefix.segments[0].kv)
    widths.clear()
    chunk = flow.config.dit.static_chunk_size
    Token2Wav(flow, hift, max_prompt_cache_bytes=flow.prefix_nbytes(chunk)).prepare_prompt(prompt)
    assert widths == [chunk] * 10


def test_final_pass_runs_after_the_stream_prefix_is_freed(
    runners: dict[str, Token2Wav], prompt: FlowPrompt, voice: PromptCache, long_tokens, monkeypatch
) -> None:
    runner = runners["plain_reuse"]
    state = runner.start_stream(prompt, voice)
    for end in range(1, long_tokens.shape[1] + 1):
        runner.stream_step(state, long_tokens[:, :end])
    assert state.flow_prefix is not None and state.flow_prefix.frames > voice.frames
    seen: list[object] = []
    original = runner.flow.inference

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(state.flow_prefix)
        return original(*args, **kwargs)

    monkeypatch.setattr(runner.flow, "inference", recording)
    runner.stream_finish(state, long_tokens)
    assert seen == [None]


def test_pass_beyond_the_budget_keeps_nothing(flow: CausalFlow, prompt: FlowPrompt) -> None:
    tokens = _long_tokens(60)
    args = (prompt.speech_token, prompt.speech_feat, prompt.embedding)
    _, first = continue_flow(flow, tokens[:, :41], *args)
    mel, same = continue_flow(flow, tokens[:, :58], *args, first, max_prefix_bytes=first.nbytes)
    assert same is first
    reference, _ = continue_flow(flow, tokens[:, :58], *args, first)
    torch.testing.assert_close(mel, reference, atol=1e-6, rtol=0)


def test_prompt_cache_budget_caches_the_first_chunks_only(
    flow: CausalFlow, hift: HiFTVocoder, prompt: FlowPrompt, voice: PromptCache, long_tokens, recomputed
) -> None:
    chunk = flow.config.dit.static_chunk_size
    assert voice.frames > chunk  # the fixture prompt has more than one fixed chunk
    limited = Token2Wav(flow, hift, max_prompt_cache_bytes=flow.prefix_nbytes(chunk) + 1000)
    cache = limited.prepare_prompt(prompt)
    assert cache.frames == chunk and cache.nbytes == flow.prefix_nbytes(chunk)
    assert voice.nbytes == flow.prefix_nbytes(voice.frames)
    _assert_chunks_close(limited.stream(long_tokens, prompt, cache), recomputed, SAME_PATH_TOLERANCE)


def test_prompt_cache_store_keeps_recent_voices_within_its_budget(
    prompt: FlowPrompt, voice: PromptCache
) -> None:
    other = FlowPrompt(prompt.speech_token, prompt.speech_feat, prompt.embedding + 1)
    made: list[str] = []

    def prepare(p: FlowPrompt) -> PromptCache:
        made.append("a" if p is prompt else "b")
        return PromptCache(p, voice.flow_prefix)

    store = PromptCacheStore(max_bytes=voice.nbytes + voice.nbytes // 2)  # room for one voice
    assert store.get("a", prompt, prepare).prompt is prompt
    assert store.get("a", prompt, prepare).prompt is prompt and made == ["a"]  # cached
    assert store.get("b", other, prepare).prompt is other
    assert "b" in store and "a" not in store and len(store) == 1 and store.nbytes == voice.nbytes
    store.get("b", prompt, prepare)  # the voice's prompt changed: prepared again, not the stale cache
    assert made == ["a", "b", "a"] and store.get("b", prompt, prepare).prompt is prompt
    store.discard("b")
    assert len(store) == 0
    tiny = PromptCacheStore(max_bytes=voice.nbytes - 1)  # one cache alone is too large: used, not kept
    assert tiny.get("a", prompt, prepare).prompt is prompt and len(tiny) == 0
    assert len(PromptCacheStore(max_bytes=None)) == 0


def test_prompt_cache_of_another_voice_is_rejected(runners, prompt: FlowPrompt, voice: PromptCache) -> None:
    other = FlowPrompt(prompt.speech_token, prompt.speech_feat, prompt.embedding + 1)
    with pytest.raises(InputError, match="different prompt"):
        runners["reuse"].start_stream(other, voice)
    same = FlowPrompt(prompt.speech_token.clone(), prompt.speech_feat.clone(), prompt.embedding.clone())
    assert runners["reuse"].start_stream(same, voice).flow_prefix is voice.flow_prefix


def test_short_prompt_has_an_empty_voice_cache(runners: dict[str, Token2Wav], prompt: FlowPrompt) -> None:
    short = FlowPrompt(prompt.speech_token[:, :20], prompt.speech_feat[:, :40], prompt.embedding)
    cache = runners["plain_reuse"].prepare_prompt(short)
    assert cache.frames == 0
    tokens = _long_tokens(80)
    _assert_chunks_close(
        runners["plain_reuse"].stream(tokens, short, cache),
        runners["plain_recompute"].stream(tokens, short),
        SAME_PATH_TOLERANCE,
    )


# ---- incremental vocoding -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def long_mel(tiny_dir: Path) -> torch.Tensor:
    """About 10 s of mel: long enough for the harmonic phase to be large (where rounding would show)."""
    with np.load(tiny_dir / "hift.npz") as data:
        mel = torch.from_numpy(data["mel"])[None]
    generator = torch.Generator().manual_seed(0)
    return torch.cat([mel + 0.1 * torch.randn(mel.shape, generator=generator) for _ in range(4)], dim=2)


@pytest.mark.parametrize("schedule", [(50, 100, 200), (9, 1, 30, 3, 200)])
def test_incremental_vocoding_equals_revocoding(
    hift: HiFTVocoder, long_mel: torch.Tensor, schedule: tuple[int, ...]
) -> None:
    state, emitted, position, index = VocoderStream(), 0, 0, 0
    total = long_mel.shape[2]
    while position < total:
        end = min(total, position + schedule[min(index, len(schedule) - 1)])
        finalize = end == total
        got = vocode_increment(hift, state, long_mel[:, :, position:end], finalize)
        whole, _ = hift.inference(long_mel[:, :, :end], finalize=finalize)
        assert got.shape[1] == whole.shape[1] - emitted
        torch.testing.assert_close(got, whole[:, emitted:], atol=1e-6, rtol=0)
        emitted, position, index = whole.shape[1], end, index + 1
    assert state.finished and state.mel is None  # nothing kept after the end
    with pytest.raises(InputError, match="finished"):
        vocode_increment(hift, state, long_mel[:, :, :10], True)


def test_vocoder_stream_keeps_only_its_context(hift: HiFTVocoder, long_mel: torch.Tensor) -> None:
    state = VocoderStream()
    for start in range(0, 400, 50):
        vocode_increment(hift, state, long_mel[:, :, start : start + 50], finalize=False)
        assert state.mel is not None and state.mel.shape[2] <= 50 + decoder_context_frames(hift.config) + 8


def test_decoder_context_bound_covers_the_receptive_field(hift: HiFTVocoder) -> None:
    # 25 frames is enough for the tiny and the full model (same kernels); the bound must not be below.
    assert 25 <= decoder_context_frames(hift.config) <= 48


def test_carried_phase_is_bit_exact(hift: HiFTVocoder) -> None:
    f0 = torch.rand(1, 3000, generator=torch.Generator().manual_seed(0)) * 400
    noise = hift.fixed_noise(3000 * hift.hop_length, f0.device).sine_noise
    whole, total = hift.m_source.excite(f0, noise)
    first, carry = hift.m_source.excite(f0[:, :1234], noise[: 1234 * hift.hop_length])
    second, total_2 = hift.m_source.excite(f0[:, 1234:], noise[1234 * hift.hop_length :], carry)
    assert torch.equal(torch.cat((first, second), dim=2), whole) and torch.equal(total, total_2)
