"""Speech-token sampling: the CPU path pinned to the tokens it has always drawn, and the device path
(`draw_on_device`, issue 15 item 10) checked on CPU tensors: same rule, same per-request generator
semantics, nothing read back but the drawn id."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from cosyserve.engine.sampling import SpeechTokenSampler, draw_on_device, top_k_stable
from cosyserve.engine.speech_lm_runner import SpeechLMRunner
from cosyserve.model.config import SamplingConfig
from cosyserve.model.speech_lm import SpeechLM
from cosyserve.modeldir.model_dir import ModelDir

SPEECH_TOKEN_SIZE = 6561
VOCAB = SPEECH_TOKEN_SIZE + 200
# Tokens the CPU path drew for the tiny model before the device path existed (text[:6], seeds 0-2);
# the same on AVX-512 and AVX2 (ATEN_CPU_CAPABILITY=avx2 ...).
PINNED = {
    0: [2245, 2561, 5530, 3875, 2961, 1818, 2468, 4809, 2704, 2610, 5043, 4785, 578, 5114, 5029, 1012,
        6019, 548, 3106, 1126, 281, 795, 4767, 1291, 3200, 3793, 5934, 403],
    1: [5443, 4538, 4563, 2426, 5208, 3527, 4459, 2525, 1646, 931, 4818, 5270, 6076, 1323, 2179, 5688,
        2751, 3450, 4486],
    2: [991, 5354, 4068, 4810, 5053, 1091, 3523, 3388, 3557, 1126, 4828, 5562, 1724, 3314, 1607, 2184,
        5920, 378, 5370, 4476, 3336],
}  # fmt: skip


def test_cpu_tokens_are_unchanged(tiny_dir: Path) -> None:
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    runner = SpeechLMRunner(SpeechLM.from_checkpoint(model_dir.file("llm.pt"), model_dir.config.llm))
    with np.load(tiny_dir / "llm.npz") as golden:
        text, prompt_text, speech = (
            golden[k].tolist() for k in ("text", "prompt_text", "prompt_speech_token")
        )
    for seed, tokens in PINNED.items():
        assert list(runner.generate(text[:6], prompt_text, speech, seed=seed)) == tokens


def _peaked(seed: int, support: int = 12) -> torch.Tensor:
    logits = torch.full((VOCAB,), -20.0)
    logits[:support] = torch.randn(support, generator=torch.Generator().manual_seed(seed)) * 2
    return logits.log_softmax(dim=0)


def _nucleus(logp: torch.Tensor, cfg: SamplingConfig) -> dict[int, float]:
    """The nucleus set's renormalised probabilities (the reference rule, in Python)."""
    probs, order = logp.softmax(dim=0).sort(descending=True, stable=True)
    kept, mass = {}, 0.0
    for p, token in zip(probs.tolist(), order.tolist(), strict=True):
        if mass >= cfg.top_p or len(kept) >= cfg.top_k:
            break
        kept[token], mass = p, mass + p
    return {token: p / mass for token, p in kept.items()}


def test_device_draw_follows_the_nucleus_distribution() -> None:
    cfg = SamplingConfig()
    logp = _peaked(3)
    expected = _nucleus(logp, cfg)
    generator = torch.Generator().manual_seed(0)
    window = torch.full((cfg.win_size,), -1)
    draws = 20000
    counts = torch.bincount(
        torch.cat([draw_on_device(logp, window, cfg, generator) for _ in range(draws)]), minlength=VOCAB
    )
    assert set(torch.nonzero(counts).flatten().tolist()) <= set(expected)
    for token, p in expected.items():
        # 5 standard deviations of a binomial count: a wrong distribution fails, chance never does.
        assert abs(int(counts[token]) / draws - p) <= 5 * (p * (1 - p) / draws) ** 0.5 + 1e-9, token


def test_device_draw_redraws_a_repeated_token() -> None:
    cfg = SamplingConfig()
    logits = torch.zeros(VOCAB)
    logits[42] = 50.0  # the nucleus draw is always 42
    generator = torch.Generator().manual_seed(0)
    fresh = torch.tensor([1, 2, 3] + [-1] * (cfg.win_size - 3))
    repeated = torch.tensor([42, 1, 2] + [-1] * (cfg.win_size - 3))
    assert int(draw_on_device(logits.log_softmax(0), fresh, cfg, generator)) == 42
    for _ in range(20):
        assert int(draw_on_device(logits.log_softmax(0), repeated, cfg, generator)) != 42


class _NoHostReads(TorchFunctionMode):
    """Raises on every call that reads a tensor's value into Python: on a GPU each is a sync."""

    READS = frozenset({"__bool__", "__int__", "__float__", "__index__", "item", "tolist", "numpy"})

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if getattr(func, "__name__", "") in self.READS:
            raise AssertionError(f"a host read: {func.__name__}")
        return func(*args, **(kwargs or {}))


def test_device_draw_reads_nothing_back() -> None:
    cfg = SamplingConfig()
    window = torch.tensor([3, 3, 3, 3] + [-1] * (cfg.win_size - 4))
    with _NoHostReads():
        token = draw_on_device(_peaked(1), window, cfg, torch.Generator().manual_seed(0))
    assert token.shape == (1,)
    with pytest.raises(AssertionError, match="host read"), _NoHostReads():
        int(token)


def _device_tokens(seed: int, steps: int = 60, min_len: int = 0) -> list[int]:
    sampler = SpeechTokenSampler(
        SamplingConfig(), SPEECH_TOKEN_SIZE, min_len=min_len, seed=seed, on_device=True
    )
    return [sampler.sample(_peaked(step)) for step in range(steps)]


def test_device_sampler_is_seeded_per_request() -> None:
    assert _device_tokens(5) == _device_tokens(5)
    assert _device_tokens(5) != _device_tokens(6)
    # Another request drawing in between does not change this one's tokens.
    a = SpeechTokenSampler(SamplingConfig(), SPEECH_TOKEN_SIZE, seed=5, on_device=True)
    b = SpeechTokenSampler(SamplingConfig(), SPEECH_TOKEN_SIZE, seed=9, on_device=True)
    interleaved = []
    for step in range(60):
        interleaved.append(a.sample(_peaked(step)))
        b.sample(_peaked(step))
    assert interleaved == _device_tokens(5)


def test_device_sampler_masks_stop_ids_before_min_len() -> None:
    logp = torch.zeros(VOCAB)
    logp[SPEECH_TOKEN_SIZE + 1] = 50.0  # EOS dominates
    sampler = SpeechTokenSampler(SamplingConfig(), SPEECH_TOKEN_SIZE, min_len=3, seed=0, on_device=True)
    drawn = [sampler.sample(logp.log_softmax(0)) for _ in range(4)]
    assert all(token < SPEECH_TOKEN_SIZE for token in drawn[:3]) and drawn[3] == SPEECH_TOKEN_SIZE + 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_sampler_on_cuda_reads_one_value_per_token() -> None:
    sampler = SpeechTokenSampler(SamplingConfig(), SPEECH_TOKEN_SIZE, seed=0)
    logp = _peaked(0).cuda()
    sampler.sample(logp.clone())  # creates the generator and the window
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with pytest.warns(UserWarning) as caught:
            sampler.sample(logp.clone())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len([w for w in caught if "synchroniz" in str(w.message)]) == 1


@pytest.mark.parametrize("k", [1, 5, 25, 40])
def test_top_k_stable_is_the_head_of_the_stable_sort(k: int) -> None:
    generator = torch.Generator().manual_seed(k)
    # Ties across the k-th place (repeated values) and zeros (masked ids), as real log-probs give.
    probs = torch.randint(0, 12, (300,), generator=generator).float().div(100)
    probs[::7] = 0.0
    values, order = top_k_stable(probs, k)
    expected_values, expected_order = probs.sort(descending=True, stable=True)
    assert torch.equal(values, expected_values[:k]) and torch.equal(order, expected_order[:k])


def test_top_k_stable_falls_back_to_the_full_sort_on_nan() -> None:
    probs = torch.tensor([0.1, float("nan"), 0.3, 0.2])
    values, order = top_k_stable(probs, 2)
    expected_values, expected_order = probs.sort(descending=True, stable=True)
    assert torch.equal(order, expected_order[:2])
    assert torch.allclose(values, expected_values[:2], equal_nan=True)
    assert top_k_stable(probs, 0)[1].numel() == 0
