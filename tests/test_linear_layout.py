"""LM product layouts: every kernel computes the same products (exact ones to float rounding), the
packed LM keeps parity, a copied layout releases its memory-mapped source, and fast kernels stay close."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cosyserve.engine import linear_kernels
from cosyserve.engine.int8 import int8_available
from cosyserve.engine.linear_kernels import (
    EXACT_KERNELS,
    PackedLinear,
    available_kernels,
    fbgemm_fp16_available,
    fp16_linear,
    pack_fp16,
    pack_linear,
    release_file_pages,
)
from cosyserve.engine.lm_layout import PRODUCTS, pack_speech_lm
from cosyserve.errors import InputError
from cosyserve.model.speech_lm import SpeechLM
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity.llm import LOGP_TOLERANCE, teacher_forced_logp

EXACT = available_kernels(EXACT_KERNELS)


@pytest.fixture(autouse=True)
def _one_thread():
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _weights(out: int, inp: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(out, inp, generator=generator) / inp**0.5, torch.randn(out, generator=generator)


@pytest.mark.parametrize("kernel", EXACT)
@pytest.mark.parametrize("bias", [True, False])
@torch.inference_mode()
def test_exact_kernels_equal_f_linear_to_float_rounding(kernel: str, bias: bool) -> None:
    weight, b = _weights(96, 80)
    packed = pack_linear(weight, b if bias else None, kernel)
    assert packed.kernel == kernel and (packed.out_features, packed.in_features) == (96, 80)
    for shape in [(1, 80), (1, 1, 80), (2, 7, 80)]:
        x = torch.randn(shape)
        expected = F.linear(x, weight, b if bias else None)
        got = packed(x)
        assert got.shape == expected.shape and got.dtype == torch.float32
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    dense, dense_bias = packed.dense_weight()
    torch.testing.assert_close(dense, weight, atol=0, rtol=0)
    assert (dense_bias is None) != bias


@pytest.mark.parametrize("kernel", EXACT)
@torch.inference_mode()
def test_fused_parts_equal_separate_products(kernel: str) -> None:
    """q/k/v and gate/up are packed as one product: the parts side by side, same values."""
    parts = [_weights(out, 64, seed) for seed, out in enumerate((64, 16, 16))]
    fused = pack_linear([w for w, _ in parts], [b for _, b in parts], kernel)
    x = torch.randn(3, 64)
    expected = torch.cat([F.linear(x, w, b) for w, b in parts], dim=-1)
    torch.testing.assert_close(fused(x), expected, atol=1e-5, rtol=1e-5)


def test_linear_kernel_uses_the_source_without_a_copy() -> None:
    weight, _ = _weights(32, 16)
    packed = pack_linear(weight, None, "linear")
    assert packed.dense_weight()[0].data_ptr() == weight.data_ptr()
    assert packed.weight_nbytes == weight.nbytes


def test_unknown_kernel_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown linear kernel"):
        pack_linear(torch.zeros(4, 4), None, "bf16")


@torch.inference_mode()
def test_fp16_fallback_equals_fbgemm_and_both_are_close_to_float32() -> None:
    weight, bias = _weights(200, 96)
    x = torch.randn(5, 96)
    fallback = fp16_linear(x, pack_fp16(weight, bias, use_fbgemm=False))
    expected = F.linear(x, weight, bias)
    assert float((fallback - expected).norm() / expected.norm()) < 1e-3
    # What both compute: float16-rounded weights, float32 products and sums.
    torch.testing.assert_close(fallback, F.linear(x, weight.half().float(), bias), atol=1e-5, rtol=1e-5)
    if not fbgemm_fp16_available():
        pytest.skip("fbgemm's float16 product is not in this torch build: the fallback is what runs")
    primary = fp16_linear(x, pack_fp16(weight, bias, use_fbgemm=True))
    torch.testing.assert_close(primary, fallback, atol=2e-5, rtol=0)


@torch.inference_mode()
def test_fp16_saturates_like_fbgemm() -> None:
    weight = torch.tensor([[1e6, -1e6, 1.0]])
    got = fp16_linear(torch.ones(1, 3), pack_fp16(weight, None, use_fbgemm=False))
    assert torch.isfinite(got).all()


@pytest.mark.skipif(not int8_available(), reason="this torch build has no fbgemm int8 kernels")
@torch.inference_mode()
def test_fused_int8_gate_up_equals_two_int8_products() -> None:
    """One activation scale for the shared input: fusing changes no value."""
    gate, up = _weights(48, 32, 1)[0], _weights(48, 32, 2)[0]
    x = torch.randn(4, 32)
    fused = pack_linear([gate, up], None, "int8", reduce_range=True)(x)
    separate = [pack_linear(w, None, "int8", reduce_range=True)(x) for w in (gate, up)]
    torch.testing.assert_close(fused, torch.cat(separate, dim=-1), atol=1e-6, rtol=0)


# ---- the packed LM keeps parity ---------------------------------------------------------------------


@pytest.fixture
def tiny_llm(model_dir: ModelDir) -> SpeechLM:
    return SpeechLM.from_checkpoint(model_dir.file("llm.pt"), model_dir.config.llm)


@pytest.mark.parametrize("kernel", EXACT)
@torch.inference_mode()
def test_packed_lm_matches_the_official_log_probs(tiny_llm: SpeechLM, tiny_dir: Path, kernel: str) -> None:
    golden = np.load(tiny_dir / "llm.npz")
    report = pack_speech_lm(tiny_llm, "exact", kernels={name: kernel for name in PRODUCTS})
    assert report.kernels == {name: kernel for name in PRODUCTS}
    layer = tiny_llm.qwen2.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, PackedLinear) and not hasattr(layer.mlp, "gate_proj")
    lm_input = torch.from_numpy(golden["lm_input"])[None]
    logp = teacher_forced_logp(tiny_llm, lm_input, torch.from_numpy(golden["forced_tokens"]).long())
    assert np.abs(logp.numpy() - golden["logp"]).max() <= LOGP_TOLERANCE


@torch.inference_mode()
def test_exact_then_fast_repacks_from_the_float32_layout(tiny_llm: SpeechLM, tiny_dir: Path) -> None:
    """The service places (exact layouts) and then applies the fast preset: the repack starts from
    the same float32 weights as packing the loaded model directly."""
    golden = np.load(tiny_dir / "llm.npz")
    lm_input = torch.from_numpy(golden["lm_input"])[None]
    forced = torch.from_numpy(golden["forced_tokens"]).long()
    direct = SpeechLM.from_checkpoint(*_llm_source(tiny_dir))
    pack_speech_lm(direct, "fast", kernels=dict.fromkeys(PRODUCTS, "fp16"))
    pack_speech_lm(tiny_llm, "exact", kernels=dict.fromkeys(PRODUCTS, EXACT[-1]))
    pack_speech_lm(tiny_llm, "fast", kernels=dict.fromkeys(PRODUCTS, "fp16"))
    torch.testing.assert_close(
        teacher_forced_logp(tiny_llm, lm_input, forced), teacher_forced_logp(direct, lm_input, forced)
    )
    with pytest.raises(ValueError, match=r"cannot repack|keeps no float32"):
        pack_speech_lm(tiny_llm, "exact", kernels=dict.fromkeys(PRODUCTS, "linear"))


def _llm_source(tiny_dir: Path):
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    return model_dir.file("llm.pt"), model_dir.config.llm


def test_small_lm_is_left_alone_in_the_exact_preset(tiny_llm: SpeechLM, tmp_path: Path) -> None:
    from cosyserve.engine.calibration import Calibration

    before = dict(tiny_llm.named_modules())
    report = pack_speech_lm(tiny_llm, "exact", Calibration(tmp_path))
    assert report.choices == {} and "unchanged" in report.label()
    assert dict(tiny_llm.named_modules()).keys() == before.keys()
    assert not any(tmp_path.iterdir())  # nothing measured, nothing written


def test_forced_kernel_from_the_environment(tiny_llm: SpeechLM, monkeypatch) -> None:
    monkeypatch.setenv("COSYSERVE_LM_KERNEL", "transposed")
    assert set(pack_speech_lm(tiny_llm, "exact").kernels.values()) == {"transposed"}
    monkeypatch.setenv("COSYSERVE_LM_KERNEL", "int8")
    with pytest.raises(InputError, match="COSYSERVE_LM_KERNEL"):
        pack_speech_lm(tiny_llm, "exact")


# ---- memory-mapped sources ----------------------------------------------------------------------------


def _resident_bytes(path: Path) -> int:
    """This process's resident bytes of its mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as smaps:
        for line in smaps:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


@pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/smaps and madvise: Linux")
@torch.inference_mode()
def test_a_copied_layout_releases_its_memory_mapped_source(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    weight, _ = _weights(1024, 512)  # 2 MB
    torch.save({"w": weight, "neighbour": torch.arange(10.0)}, path)
    state = torch.load(path, mmap=True, weights_only=True)
    mapped = state["w"]
    assert float(mapped.sum()) == pytest.approx(float(weight.sum()), rel=1e-5)  # every page touched
    assert _resident_bytes(path) >= mapped.nbytes // 2  # (the kernel may already reclaim some)
    packed = pack_linear(mapped, None, "transposed")
    # What stays is at most the pages the tensor shares with its neighbours and the file's header.
    assert _resident_bytes(path) <= 4 * mmap.PAGESIZE
    # The data is intact: the mapping's pages come back from the file when read again.
    torch.testing.assert_close(mapped, weight, atol=0, rtol=0)
    torch.testing.assert_close(state["neighbour"], torch.arange(10.0))
    x = torch.randn(1, 512)
    torch.testing.assert_close(packed(x), F.linear(x, weight), atol=1e-5, rtol=1e-5)


def test_anonymous_memory_is_never_released() -> None:
    weight = torch.randn(512, 512)
    copy = weight.clone()
    assert release_file_pages(weight) == 0
    torch.testing.assert_close(weight, copy, atol=0, rtol=0)


def test_file_mapping_detection_needs_a_private_file_mapping(monkeypatch) -> None:
    assert not linear_kernels._in_file_mapping(0, 4096)
