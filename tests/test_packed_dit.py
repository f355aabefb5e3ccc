"""The exact DiT's products on oneDNN-packed weights (`engine.packed_dit`): chosen by measurement or
forced, the same values as MKL's product up to float rounding, never fed what they cannot take."""

from __future__ import annotations

import copy

import pytest
import torch

from cosyserve.bench.full_random import build_random_models
from cosyserve.engine import packed_dit
from cosyserve.engine.device import Placement
from cosyserve.engine.linear_kernels import onednn_available
from cosyserve.engine.loading import place_flow

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN products")


@pytest.fixture
def forced(monkeypatch):
    def force(product: str) -> None:
        monkeypatch.setenv("COSYSERVE_DIT_PRODUCT", product)
        packed_dit.packed_products_chosen.cache_clear()

    yield force
    packed_dit.packed_products_chosen.cache_clear()


def _pass(flow) -> torch.Tensor:
    dit = flow.decoder.estimator
    c, g = dit.config, torch.Generator().manual_seed(0)
    x, cond = torch.randn(2, c.mel_dim, 60, generator=g), torch.randn(2, c.mel_dim, 60, generator=g)
    mu, spks = torch.randn(2, c.mu_dim, 60, generator=g), torch.randn(2, c.spk_dim, generator=g)
    with torch.inference_mode():
        return dit(x, None, mu, torch.tensor([0.3, 0.3]), spks, cond)


def test_packed_products_give_the_exact_dits_values(forced) -> None:
    flow = build_random_models("tiny").flow
    cpu = Placement(torch.device("cpu"))
    forced("mkl")
    plain = place_flow(copy.deepcopy(flow), cpu, pack=True)
    forced("onednn")
    packed = place_flow(copy.deepcopy(flow), cpu, pack=True)
    unpacked_preset = place_flow(copy.deepcopy(flow), cpu, pack=False)  # a preset converts them itself
    kinds = lambda f: {type(m).__name__ for m in f.decoder.estimator.transformer_blocks.modules()}  # noqa: E731
    assert "PackedLinear" in kinds(packed) and "PackedLinear" not in kinds(plain) | kinds(unpacked_preset)
    expected, got = _pass(plain), _pass(packed)
    assert torch.allclose(got, expected, rtol=0, atol=1e-5 * float(expected.abs().max())), float(
        (got - expected).abs().max()
    )
    layer = next(m for m in packed.decoder.estimator.modules() if isinstance(m, packed_dit.PackedLinear))
    with pytest.raises(TypeError, match="float32 CPU inputs"):
        layer(torch.zeros(1, layer.in_features, dtype=torch.bfloat16))


def test_the_choice_is_measured_once_per_process(forced, monkeypatch) -> None:
    forced("")  # measured: whichever is faster here, by the margin
    timings = iter([(10.0, 5.0)])
    monkeypatch.setattr(packed_dit, "_timed_both", lambda: next(timings))
    assert packed_dit.packed_products_chosen() is True
    assert packed_dit.packed_products_chosen() is True  # cached: measured once
    packed_dit.packed_products_chosen.cache_clear()
    monkeypatch.setattr(packed_dit, "_timed_both", lambda: (10.0, 9.9))  # within the margin: MKL's
    assert packed_dit.packed_products_chosen() is False
