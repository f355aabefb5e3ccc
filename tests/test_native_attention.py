"""The compiled attention of one new LM position: the torch path's outputs and cache to float rounding
over many steps, grouped heads and several rows; inputs it does not take go the torch way; the
placed LM uses it and keeps the official log-probs; the switch turns it off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cosyserve.engine import native_int8
from cosyserve.engine.device import Placement
from cosyserve.engine.loading import place_speech_lm
from cosyserve.engine.native_attention import (
    NewPositionAttention,
    native_attention_available,
    use_native_attention,
)
from cosyserve.model.config import Qwen2Config
from cosyserve.model.qwen2 import Attention, RotaryTable
from cosyserve.model.speech_lm import SpeechLM
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity.llm import LOGP_TOLERANCE, teacher_forced_logp

pytestmark = pytest.mark.skipif(
    not (native_int8.cpu_supports_kernel(kernel="gemv_avx2") and native_int8.compiler() is not None),
    reason="needs avx2 and fma, and gcc",
)


def _layer(heads: int, kv_heads: int, head_dim: int, seed: int = 0) -> Attention:
    generator = torch.Generator().manual_seed(seed)
    layer = Attention(Qwen2Config(heads * head_dim, 4, 1, heads, kv_heads, 10, 1e-6, 10000.0, 512))
    for parameter in layer.parameters():  # a trained layer's scale: outputs near 1, scores of a few units
        parameter.data = torch.randn(parameter.shape, generator=generator) / parameter.shape[-1] ** 0.5
    return layer


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "batch"), [(14, 2, 64, 1), (4, 4, 16, 3), (6, 1, 8, 2)]
)
@torch.inference_mode()
def test_many_steps_equal_the_torch_path_to_float_rounding(
    heads: int, kv_heads: int, head_dim: int, batch: int
) -> None:
    layer = _layer(heads, kv_heads, head_dim)
    rotary = RotaryTable(head_dim, 10000.0, 512)
    capacity, prefix = 80, 20
    generator = torch.Generator().manual_seed(1)
    cache = torch.zeros(2, batch, kv_heads, capacity, head_dim)
    prompt = torch.randn(batch, prefix, heads * head_dim, generator=generator)
    layer(prompt, *rotary(0, prefix), cache, 0, None)  # a prefill through torch, as the LM does
    compiled_cache = cache.clone()
    compiled = NewPositionAttention(heads, kv_heads, head_dim)
    for start in range(prefix, capacity):
        x = torch.randn(batch, 1, heads * head_dim, generator=generator)
        cos, signed_sin = rotary(start, 1)
        expected = layer(x, cos, signed_sin, cache, start, None)
        assert compiled(*layer._project(x), cos, signed_sin, compiled_cache.clone(), start) is not None
        layer.one_position = compiled
        got = layer(x, cos, signed_sin, compiled_cache, start, None)
        layer.one_position = None
        assert float((got - expected).abs().max() / expected.abs().max()) < 1e-5, start
        assert float((compiled_cache - cache).abs().max() / cache.abs().max()) < 1e-5, start
        compiled_cache.copy_(cache)  # each step from the same cache: errors do not add up across steps


@torch.inference_mode()
def test_inputs_it_does_not_take_go_the_torch_way() -> None:
    layer = _layer(4, 2, 8)
    compiled = NewPositionAttention(4, 2, 8)
    rotary = RotaryTable(8, 10000.0, 64)
    cos, signed_sin = rotary(3, 1)
    q, k, v = layer._project(torch.randn(1, 1, 32))
    cache = torch.randn(2, 1, 2, 10, 8)
    assert compiled(q, k, v, cos, signed_sin, cache, 3) is not None
    assert (
        compiled(q.double(), k.double(), v.double(), cos.double(), signed_sin.double(), cache.double(), 3)
        is None
    )
    assert compiled(q, k, v, cos, signed_sin, cache.transpose(3, 4).contiguous().transpose(3, 4), 3) is None
    assert compiled(q, k, v, cos, signed_sin, cache, 10) is None  # past the capacity
    assert compiled(q, k, v, cos, signed_sin, cache[:, :, :1], 3) is None  # another head count
    odd = NewPositionAttention(4, 2, 6)  # a head size the kernel does not take (not a multiple of 8)
    q6, k6, v6 = torch.randn(1, 1, 24), torch.randn(1, 1, 12), torch.randn(1, 1, 12)
    assert odd(q6, k6, v6, cos[:, :6], signed_sin[:, :6], torch.randn(2, 1, 2, 10, 6), 3) is None
    # the layer then runs torch's path: the same output either way
    layer.one_position = compiled
    bf16 = layer.to(torch.bfloat16)
    out = bf16(
        torch.randn(1, 1, 32, dtype=torch.bfloat16),
        cos.bfloat16(),
        signed_sin.bfloat16(),
        cache.bfloat16(),
        3,
        None,
    )
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


@torch.inference_mode()
def test_the_placed_lm_uses_it_and_keeps_the_official_log_probs(tiny_dir: Path) -> None:
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    llm = place_speech_lm(
        SpeechLM.from_checkpoint(model_dir.file("llm.pt"), model_dir.config.llm),
        Placement(torch.device("cpu")),
    )
    assert all(isinstance(layer.self_attn.one_position, NewPositionAttention) for layer in llm.qwen2.layers)
    golden = np.load(tiny_dir / "llm.npz")
    lm_input = torch.from_numpy(golden["lm_input"])[None]
    logp = teacher_forced_logp(llm, lm_input, torch.from_numpy(golden["forced_tokens"]).long())
    assert np.abs(logp.numpy() - golden["logp"]).max() <= LOGP_TOLERANCE


def test_switched_off_the_lm_keeps_torch_s_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    native_int8.forget_loading()
    monkeypatch.setenv("COSYSERVE_NATIVE_KERNELS", "0")
    try:
        layer = _layer(4, 2, 8)
        assert not native_attention_available() and use_native_attention(layer) == 0
        assert layer.one_position is None
    finally:
        monkeypatch.delenv("COSYSERVE_NATIVE_KERNELS")
        native_int8.forget_loading()
