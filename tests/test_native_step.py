"""The compiled decoding step (every decoder layer in one call): the layer-by-layer way's hidden states
and cache to float rounding over many steps with each of our kernels, the official log-probs in the
exact preset, inputs it does not take going layer by layer, the layouts it needs (and the kernel
choice that gives them), a deep copy that does not share it, and the switch that turns it off."""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from cosyserve.engine import native_int8
from cosyserve.engine.calibration import Choice
from cosyserve.engine.lm_layout import PRODUCTS, _for_compiled_step, pack_speech_lm
from cosyserve.engine.native_int8 import native_int8_available
from cosyserve.engine.native_step import (
    MAX_ROWS,
    CompiledDecodeStep,
    compiled_step_available,
    use_compiled_step,
)
from cosyserve.engine.speech_lm_runner import SpeechLMRunner
from cosyserve.model.speech_lm import SpeechLM
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity.llm import LOGP_TOLERANCE, teacher_forced_logp

pytestmark = pytest.mark.skipif(
    not (native_int8.cpu_supports_kernel(kernel="gemv_avx2") and native_int8.compiler() is not None),
    reason="needs avx2 and fma, and gcc",
)

_LAYER_PRODUCTS = [name for name in PRODUCTS if name != "llm_decoder"]


def _tiny_llm(tiny_dir: Path) -> SpeechLM:
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    return SpeechLM.from_checkpoint(model_dir.file("llm.pt"), model_dir.config.llm)


def _packed(tiny_dir: Path, kernel: str, preset: str) -> SpeechLM:
    llm = _tiny_llm(tiny_dir)
    report = pack_speech_lm(
        llm, preset, kernels={**dict.fromkeys(_LAYER_PRODUCTS, kernel), "llm_decoder": "linear"}
    )
    assert report.compiled_step and "compiled step" in report.label()
    assert isinstance(llm.qwen2.decode_step, CompiledDecodeStep)
    return llm


_KERNELS = [
    pytest.param("gemv_avx2", "exact", id="gemv_avx2"),
    pytest.param("int8_avx2", "fast", id="int8_avx2"),
    pytest.param(
        "int8_vnni",
        "fast",
        id="int8_vnni",
        marks=pytest.mark.skipif(not native_int8_available("int8_vnni"), reason="needs avx512_vnni"),
    ),
]


@pytest.mark.parametrize(("kernel", "preset"), _KERNELS)
@torch.inference_mode()
def test_many_steps_equal_the_layers_one_by_one(tiny_dir: Path, kernel: str, preset: str) -> None:
    llm = _packed(tiny_dir, kernel, preset)
    model, step = llm.qwen2, llm.qwen2.decode_step
    config = model.config
    generator = torch.Generator().manual_seed(0)
    capacity, prefix = 90, 25
    cache = torch.zeros(len(model.layers), 2, 1, config.num_key_value_heads, capacity, config.head_dim)
    model(torch.randn(1, prefix, config.hidden_size, generator=generator), cache, 0)  # the prefill: layers
    compiled_cache = cache.clone()
    for start in range(prefix, capacity):
        x = torch.randn(1, 1, config.hidden_size, generator=generator)
        model.decode_step = None
        expected = model(x, cache, start)
        model.decode_step = step
        assert step(x, compiled_cache.clone(), [start]) is not None
        got = model(x, compiled_cache, start)
        assert float((got - expected).abs().max() / expected.abs().max()) < 1e-5, start
        assert float((compiled_cache - cache).abs().max() / cache.abs().max()) < 1e-5, start
        compiled_cache.copy_(cache)  # each step from the same cache: errors do not add up across steps


@pytest.mark.parametrize(("kernel", "preset"), _KERNELS[:2])
@torch.inference_mode()
def test_a_batch_of_sequences_at_their_own_positions_equals_forward_rows(
    tiny_dir: Path, kernel: str, preset: str
) -> None:
    # Batched decoding (`decode_batching`): each row at its own position, over its own keys only.
    llm = _packed(tiny_dir, kernel, preset)
    model, step = llm.qwen2, llm.qwen2.decode_step
    config = model.config
    generator = torch.Generator().manual_seed(1)
    rows, capacity = 5, 40
    shape = (len(model.layers), 2, rows, config.num_key_value_heads, capacity, config.head_dim)
    cache = torch.randn(shape, generator=generator)
    cache[:, :, 1, :, 20:] = 1e6  # past row 1's position: masked out (torch) or never read (compiled)
    compiled_cache = cache.clone()
    positions = torch.tensor([7, 19, 0, 33, 19])
    x = torch.randn(rows, 1, config.hidden_size, generator=generator)
    model.decode_step = None
    expected = model.forward_rows(x, cache, positions, capacity)
    model.decode_step = step
    assert step(x, compiled_cache.clone(), positions.tolist()) is not None
    got = model.forward_rows(x, compiled_cache, positions, capacity)
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-5
    assert float((compiled_cache - cache).abs().max()) < 1e-5 * float(cache.abs().max())
    # The compiled step never reads past a row's position: even a NaN there stays out (the torch way
    # needs such slots zeroed: 0 x NaN is NaN).
    poisoned = compiled_cache.clone()
    poisoned[:, :, 1, :, 20:] = float("nan")
    torch.testing.assert_close(
        step(x, poisoned, positions.tolist()), step(x, compiled_cache.clone(), positions.tolist())
    )
    # A row alone gets what it gets in the batch.
    alone = compiled_cache[:, :, 3:4].clone()
    torch.testing.assert_close(
        step(x[3:4], alone, [33]), step(x, compiled_cache.clone(), positions.tolist())[3:4]
    )


@torch.inference_mode()
def test_the_exact_preset_with_it_keeps_the_official_log_probs(tiny_dir: Path) -> None:
    llm = _packed(tiny_dir, "gemv_avx2", "exact")
    golden = np.load(tiny_dir / "llm.npz")
    lm_input = torch.from_numpy(golden["lm_input"])[None]
    logp = teacher_forced_logp(llm, lm_input, torch.from_numpy(golden["forced_tokens"]).long())
    assert np.abs(logp.numpy() - golden["logp"]).max() <= LOGP_TOLERANCE


@torch.inference_mode()
def test_inputs_it_does_not_take_go_layer_by_layer(tiny_dir: Path) -> None:
    llm = _packed(tiny_dir, "gemv_avx2", "exact")
    model, step = llm.qwen2, llm.qwen2.decode_step
    config = model.config
    shape = (len(model.layers), 2, 1, config.num_key_value_heads, 12, config.head_dim)
    cache, x = torch.randn(shape), torch.randn(1, 1, config.hidden_size)
    assert step(x, cache, [3]) is not None
    many = MAX_ROWS + 1
    rows = torch.randn((*shape[:2], many, *shape[3:]))
    assert step(x.expand(many, 1, -1), rows, [3] * many) is None  # more rows than a step takes
    assert step(x, cache, [12]) is None  # past the capacity
    assert step(x, cache, [3, 4]) is None  # positions for rows the cache does not hold
    assert step(x.double(), cache.double(), [3]) is None
    strided = cache.transpose(4, 5).contiguous().transpose(4, 5)
    assert step(x, strided, [3]) is None
    # The model then runs its layers: the same values either way.
    model.decode_step = None
    expected = model(x, strided.clone(), 3)
    model.decode_step = step
    torch.testing.assert_close(model(x, strided, 3), expected)
    # Hidden states asked for: the layers, which can hand them out.
    hidden: list[torch.Tensor] = []
    model(x, cache, 4, hidden_states=hidden)
    assert len(hidden) == len(model.layers) + 1


@torch.inference_mode()
def test_two_requests_decoding_at_once_get_what_each_gets_alone(tiny_dir: Path) -> None:
    # The service may decode two requests on one model from two threads: no scratch is shared.
    llm = _packed(tiny_dir, "int8_avx2", "fast")
    golden = np.load(tiny_dir / "llm.npz")
    forced = torch.from_numpy(golden["forced_tokens"]).long()
    lm_inputs = [torch.from_numpy(golden["lm_input"])[None], torch.randn(1, 9, llm.hidden_size)]
    alone = [teacher_forced_logp(llm, lm_input, forced) for lm_input in lm_inputs]
    results: list[list[torch.Tensor]] = [[], []]

    def decode(index: int) -> None:
        with torch.inference_mode():
            for _ in range(3):
                results[index].append(teacher_forced_logp(llm, lm_inputs[index], forced))

    threads = [threading.Thread(target=decode, args=(index,)) for index in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index in (0, 1):
        assert len(results[index]) == 3
        for logp in results[index]:
            torch.testing.assert_close(logp, alone[index], rtol=0, atol=0)


def test_a_request_on_a_saved_voice_draws_the_same_tokens_with_it(tiny_dir: Path) -> None:
    # The service's path: a voice's prepared LM prefix, then a seeded request decoding after it.
    llm = _packed(tiny_dir, "gemv_avx2", "exact")
    runner = SpeechLMRunner(llm)
    prefix = runner.prepare_prefix([11, 12, 13, 151646])  # <|endofprompt|> closes the prompt
    request = {"text_ids": [21, 22, 23, 24, 25], "prompt_speech_ids": [1, 2, 3], "prefix": prefix, "seed": 3}
    step, taken = llm.qwen2.decode_step, []

    def counted(*args: object) -> torch.Tensor | None:
        out = step(*args)
        taken.append(out is not None)
        return out

    llm.qwen2.decode_step = counted
    with_step = list(runner.generate(**request))
    assert len(with_step) > 5 and len(taken) >= len(with_step) - 1 and all(taken)
    llm.qwen2.decode_step = None
    assert list(runner.generate(**request)) == with_step


def test_it_needs_every_layer_product_in_our_kernels_with_the_norms_inside(tiny_dir: Path) -> None:
    llm = _tiny_llm(tiny_dir)
    mixed = {**dict.fromkeys(_LAYER_PRODUCTS, "gemv_avx2"), "o": "linear", "llm_decoder": "linear"}
    report = pack_speech_lm(llm, "exact", kernels=mixed)
    assert not report.compiled_step and llm.qwen2.decode_step is None
    with pytest.raises(ValueError, match="runs linear"):
        CompiledDecodeStep(llm.qwen2)
    # Repacked into kernels it takes: set; repacked out of them: cleared (it points at the products).
    pack_speech_lm(llm, "exact", kernels=dict.fromkeys(PRODUCTS, "gemv_avx2"))
    assert llm.qwen2.decode_step is not None
    pack_speech_lm(llm, "fast", kernels=dict.fromkeys(PRODUCTS, "fp16"))
    assert llm.qwen2.decode_step is None and not use_compiled_step(llm.qwen2)


@torch.inference_mode()
def test_products_with_a_bfloat16_prefill_copy_take_it_too(tiny_dir: Path) -> None:
    llm = _tiny_llm(tiny_dir)
    kernels = {**dict.fromkeys(_LAYER_PRODUCTS, "int8_avx2"), "llm_decoder": "linear"}
    report = pack_speech_lm(llm, "fast", kernels=kernels, prefill_bfloat16=lambda _kernel: True)
    assert report.compiled_step and report.prefill_bfloat16
    model, step = llm.qwen2, llm.qwen2.decode_step
    config = model.config
    cache = torch.randn(len(model.layers), 2, 1, config.num_key_value_heads, 12, config.head_dim)
    x = torch.randn(1, 1, config.hidden_size)
    model.decode_step = None
    expected = model(x, cache.clone(), 3)
    model.decode_step = step
    assert step(x, cache.clone(), [3]) is not None
    assert float((model(x, cache, 3) - expected).abs().max() / expected.abs().max()) < 1e-5


def _choice(kernel: str, source: str = "measured") -> Choice:
    return Choice("8x8", "fast", kernel, source)


def test_the_other_layer_products_follow_a_chosen_kernel_of_ours() -> None:
    chosen = {"qkv": "int8_avx2", "o": "int8", "gate_up": "int8_avx2", "down": "fp16", "llm_decoder": "fp16"}
    choices = _for_compiled_step({name: _choice(kernel) for name, kernel in chosen.items()}, {})
    assert {name: c.kernel for name, c in choices.items()} == {
        **dict.fromkeys(_LAYER_PRODUCTS, "int8_avx2"),
        "llm_decoder": "fp16",  # after the step, in torch
    }
    assert choices["o"].source == choices["down"].source == "compiled step"
    assert choices["qkv"].source == "measured"
    # A forced kernel stays; none of ours chosen: nothing changes.
    forced = {"o": "int8"}
    kept = _for_compiled_step({name: _choice(kernel) for name, kernel in chosen.items()}, forced)
    assert kept["o"].kernel == "int8" and kept["down"].kernel == "int8_avx2"
    theirs = {name: _choice("fp16") for name in PRODUCTS}
    assert _for_compiled_step(theirs, {}) == theirs


def test_a_deep_copy_decodes_layer_by_layer(tiny_dir: Path) -> None:
    llm = _packed(tiny_dir, "gemv_avx2", "exact")
    copied = copy.deepcopy(llm)
    assert copied.qwen2.decode_step is None and llm.qwen2.decode_step is not None


def test_switched_off_it_is_not_set(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    llm = _tiny_llm(tiny_dir)
    native_int8.forget_loading()
    monkeypatch.setenv("COSYSERVE_NATIVE_KERNELS", "0")
    try:
        assert not compiled_step_available() and not use_compiled_step(llm.qwen2)
        assert llm.qwen2.decode_step is None
    finally:
        monkeypatch.delenv("COSYSERVE_NATIVE_KERNELS")
        native_int8.forget_loading()
