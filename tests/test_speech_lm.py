"""Speech LM: parity with the official outputs, KV cache, sampling rules, generation loop, loading."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from cosyserve.engine.kv_cache import KVCache
from cosyserve.engine.sampling import SpeechTokenSampler, repetition_aware_sample
from cosyserve.engine.speech_lm_runner import SpeechLMRunner, length_limits, prefill
from cosyserve.errors import CheckpointError, InputError
from cosyserve.model.checkpoint import load_into, read_state_dict
from cosyserve.model.config import Qwen2Config, SamplingConfig
from cosyserve.model.sizes import full_size_config
from cosyserve.model.speech_lm import SpeechLM, checkpoint_to_module_names
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity import llm as llm_parity

SPEECH_TOKEN_SIZE = 6561
VOCAB = SPEECH_TOKEN_SIZE + 200


@pytest.fixture(scope="module")
def model(model_dir: ModelDir) -> SpeechLM:
    return SpeechLM.from_checkpoint(model_dir.file("llm.pt"), model_dir.config.llm)


@pytest.fixture(scope="module")
def golden(tiny_dir: Path) -> dict[str, np.ndarray]:
    return dict(np.load(tiny_dir / "llm.npz"))


@pytest.fixture(scope="module")
def runner(model: SpeechLM) -> SpeechLMRunner:
    return SpeechLMRunner(model)


def _request(golden: dict[str, np.ndarray]) -> tuple[list[int], list[int], list[int]]:
    return golden["text"].tolist(), golden["prompt_text"].tolist(), golden["prompt_speech_token"].tolist()


# --- parity ---------------------------------------------------------------------------------------


def test_llm_parity(model_dir: ModelDir, tiny_dir: Path) -> None:
    results = {r.name: r for r in llm_parity.run(model_dir, tiny_dir)}
    for result in results.values():
        assert result.passed, result
    assert results["llm lm_input"].max_abs_diff <= 1e-5
    assert results["llm logp prefill"].max_abs_diff <= 1e-4
    assert results["llm logp decode vs full pass"].max_abs_diff <= 1e-4
    assert results["llm logp decode vs fixture"].max_abs_diff <= 1e-4  # transformers 4.51.3 fixture
    assert "llm llm_hidden_states_2" in results


def test_hidden_states_match_debug(model: SpeechLM, golden: dict[str, np.ndarray], tiny_dir: Path) -> None:
    debug = np.load(tiny_dir / "debug.npz")
    lm_input = torch.from_numpy(golden["lm_input"])[None]
    cache = KVCache.allocate(model.config.qwen2, lm_input.shape[1])
    hidden: list[torch.Tensor] = []
    with torch.inference_mode():
        model(lm_input, cache.buffer, cache.reserve(lm_input.shape[1]), hidden_states=hidden)
    assert len(hidden) == model.config.qwen2.num_hidden_layers + 1
    for index, state in enumerate(hidden):
        assert np.abs(state[0].numpy() - debug[f"llm_hidden_states_{index}"]).max() <= 1e-4


# --- KV cache -------------------------------------------------------------------------------------


def test_prefix_reuse_matches_full_prefill(runner: SpeechLMRunner, model: SpeechLM, golden) -> None:
    text, prompt_text, speech = (torch.tensor(x) for x in _request(golden))
    with torch.inference_mode():
        full_cache = KVCache.allocate(model.config.qwen2, 200)
        full = prefill(model, model.embed_prefix(prompt_text, text, speech), full_cache)
        prefix = runner.prepare_prefix(prompt_text)
        saved = prefix.cache.buffer.clone()
        cache = prefix.cache.clone(200)
        reused = prefill(model, model.embed_request_suffix(text, speech), cache)
    assert cache.length == full_cache.length
    assert torch.allclose(reused, full, atol=1e-5, rtol=0)
    assert prefix.cache.length == 1 + len(prompt_text) and torch.equal(prefix.cache.buffer, saved)


def test_generation_with_prefix_matches_without(runner: SpeechLMRunner, golden) -> None:
    text, prompt_text, speech = _request(golden)
    plain = list(runner.generate(text, prompt_text, speech, seed=3))
    prefix = runner.prepare_prefix(prompt_text)
    reused = list(runner.generate(text, (), speech, prefix=prefix, seed=3))
    again = list(runner.generate(text, (), speech, prefix=prefix, seed=3))
    assert plain == reused == again and plain


def test_kv_cache_capacity_and_clone() -> None:
    config = Qwen2Config(8, 16, 2, 2, 1, 100, 1e-6, 1e4, 64)
    cache = KVCache.allocate(config, 4)
    assert cache.buffer.shape == (2, 2, 1, 1, 4, 4)
    cache.buffer.normal_()
    assert cache.reserve(3) == 0 and cache.remaining == 1
    with pytest.raises(ValueError, match="KV cache full"):
        cache.reserve(2)
    bigger = cache.clone(10)
    assert bigger.length == 3 and bigger.capacity == 10
    assert torch.equal(bigger.buffer[..., :3, :], cache.buffer[..., :3, :])
    assert cache.compact().capacity == 3


# --- sampling -------------------------------------------------------------------------------------


def _official_style_draw(
    scores: torch.Tensor, history: list[int], cfg: SamplingConfig, gen: torch.Generator
) -> int:
    """The reference rule written as a plain loop, consuming the generator the same way."""
    probs, order = scores.softmax(dim=0).sort(descending=True, stable=True)
    kept, mass = [], 0.0
    for p in probs.tolist():
        if mass < cfg.top_p and len(kept) < cfg.top_k:
            kept.append(p)
            mass += p
        else:
            break
    token = int(order[torch.multinomial(torch.tensor(kept), 1, replacement=True, generator=gen)])
    if sum(t == token for t in history[-cfg.win_size :]) >= cfg.win_size * cfg.tau_r:
        scores[token] = -float("inf")
        token = int(torch.multinomial(scores.softmax(dim=0), 1, replacement=True, generator=gen))
    return token


def test_sampling_follows_the_reference_rule() -> None:
    cfg = SamplingConfig()
    scores_gen = torch.Generator().manual_seed(0)
    ours, reference = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    history: list[int] = []
    for _ in range(200):
        # Peaked logits over a small alphabet, so repeats (and redraws) happen often.
        logits = torch.full((VOCAB,), -20.0)
        logits[:12] = torch.randn(12, generator=scores_gen) * 2
        logp = logits.log_softmax(dim=0)
        a = repetition_aware_sample(logp.clone(), history, cfg, ours)
        b = _official_style_draw(logp.clone(), history, cfg, reference)
        assert a == b
        history.append(a)


def test_repeated_top_token_is_redrawn() -> None:
    cfg = SamplingConfig()
    logits = torch.full((VOCAB,), 0.0)
    logits[42] = 50.0  # nucleus draw is always 42
    gen = torch.Generator().manual_seed(0)
    assert repetition_aware_sample(logits.clone(), [1, 2, 3], cfg, gen) == 42
    for seed in range(20):
        gen.manual_seed(seed)
        assert repetition_aware_sample(logits.clone(), [42, 1, 2], cfg, gen) != 42
    # Outside the window of the last `win_size` tokens, an old 42 does not count.
    assert repetition_aware_sample(logits.clone(), [42] + [7] * cfg.win_size, cfg, gen) == 42


def test_stop_ids_are_masked_before_min_len() -> None:
    logits = torch.full((VOCAB,), 0.0)
    logits[SPEECH_TOKEN_SIZE + 1] = 50.0  # EOS dominates
    logits[SPEECH_TOKEN_SIZE + 5] = 40.0  # and another stop id
    sampler = SpeechTokenSampler(SamplingConfig(), SPEECH_TOKEN_SIZE, min_len=5, seed=0)
    drawn = [sampler.sample(logits.clone()) for _ in range(6)]
    assert all(t < SPEECH_TOKEN_SIZE for t in drawn[:5])
    assert drawn[5] == SPEECH_TOKEN_SIZE + 1 and sampler.is_stop(drawn[5])
    assert len(sampler.history) == 5


def test_length_limits() -> None:
    assert length_limits(20, 2.0, 20.0) == (40, 400)
    assert length_limits(7, 2.0, 20.0) == (14, 140)


def test_max_len_stops_generation(model: SpeechLM, golden) -> None:
    # min == max: stop ids are masked for every step, so exactly max_len tokens come out.
    runner = SpeechLMRunner(model, min_token_text_ratio=0.5, max_token_text_ratio=0.5)
    tokens = list(runner.generate(*_request(golden), seed=0))
    assert len(tokens) == len(golden["text"]) // 2
    assert all(0 <= t < SPEECH_TOKEN_SIZE for t in tokens)


def test_seeded_generation_is_reproducible_and_isolated(runner: SpeechLMRunner, golden) -> None:
    text, prompt_text, speech = _request(golden)
    text = text[:5]  # at most 100 tokens per request keeps the test fast
    alone_a = list(runner.generate(text, prompt_text, speech, seed=11))
    alone_b = list(runner.generate(text[:3], prompt_text, speech[:30], seed=12))
    assert alone_a == list(runner.generate(text, prompt_text, speech, seed=11))
    assert alone_a != list(runner.generate(text, prompt_text, speech, seed=13))
    # Two requests stepping alternately (and a global-RNG consumer in between) give the same tokens.
    gen_a = runner.generate(text, prompt_text, speech, seed=11)
    gen_b = runner.generate(text[:3], prompt_text, speech[:30], seed=12)
    mixed_a, mixed_b = [], []
    done_a = done_b = False
    while not (done_a and done_b):
        torch.rand(3)
        if not done_a:
            try:
                mixed_a.append(next(gen_a))
            except StopIteration:
                done_a = True
        if not done_b:
            try:
                mixed_b.append(next(gen_b))
            except StopIteration:
                done_b = True
    assert mixed_a == alone_a and mixed_b == alone_b


def test_cancel_stops_between_steps(runner: SpeechLMRunner, golden) -> None:
    event = threading.Event()
    tokens = []
    for token in runner.generate(*_request(golden), seed=0, cancel=event):
        tokens.append(token)
        if len(tokens) == 3:
            event.set()
    assert len(tokens) == 3
    calls = []
    assert list(runner.generate(*_request(golden), seed=0, cancel=lambda: calls.append(1) or True)) == []


def test_input_errors(runner: SpeechLMRunner, golden) -> None:
    text, prompt_text, speech = _request(golden)
    with pytest.raises(InputError, match="endofprompt"):
        runner.generate(text, [1, 2, 3], speech)
    with pytest.raises(InputError, match="prompt speech tokens"):
        runner.generate(text, prompt_text, [SPEECH_TOKEN_SIZE])
    with pytest.raises(InputError, match="empty"):
        runner.generate([], prompt_text, speech)
    with pytest.raises(InputError, match="LM positions"):
        runner.generate(text * 200, prompt_text, speech)


# --- loading --------------------------------------------------------------------------------------


def test_lm_head_is_dropped_and_strictness_kept(model: SpeechLM, model_dir: ModelDir) -> None:
    assert not any("lm_head" in key for key in model.state_dict())
    assert not hasattr(model.qwen2, "lm_head")
    raw = read_state_dict(model_dir.file("llm.pt"))
    assert "llm.model.lm_head.weight" in raw
    renamed = checkpoint_to_module_names(raw)
    assert "llm.model.lm_head.weight" not in renamed
    with torch.device("meta"):
        fresh = SpeechLM(model_dir.config.llm)
    with pytest.raises(CheckpointError, match=r"unexpected: llm\.extra\.weight"):
        load_into(fresh, {**renamed, "llm.extra.weight": torch.zeros(1)}, "llm.pt")
    without_norm = {k: v for k, v in renamed.items() if k != "qwen2.norm.weight"}
    with pytest.raises(CheckpointError, match=r"missing: qwen2\.norm\.weight"):
        load_into(fresh, without_norm, "llm.pt")


def test_full_size_architecture_on_meta() -> None:
    config = full_size_config().llm  # the count below is worked out independently of it
    with torch.device("meta"):
        model = SpeechLM(config)
    assert all(p.device.type == "meta" for p in model.parameters())
    count = sum(p.numel() for p in model.parameters())
    per_layer = (896 * 896 + 896) + 2 * (128 * 896 + 128) + 896 * 896 + 3 * 896 * 4864 + 2 * 896
    expected = 151936 * 896 + 24 * per_layer + 896 + 2 * VOCAB * 896
    assert count == expected == 506_148_480
    assert model.qwen2.layers[0].self_attn.k_proj.weight.shape == (128, 896)
