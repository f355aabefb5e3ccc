"""The compiled int8 kernels (`engine/native_int8.py`): `int8_vnni` for AVX-512 VNNI CPUs and
`int8_avx2` for the others. They build with the system compiler on any x86-64 machine, compute exactly
the quantised product they document (checked against the same arithmetic in torch, integer sums
exact), agree with fbgemm's int8 product, and are offered only where they run. Each product check runs
for every kernel this CPU has (AVX2 on all of CI's families, VNNI on the Intel Xeon and AMD Zen 5);
the others are skipped there and shown not to be offered."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cosyserve.engine import native_int8
from cosyserve.engine.int8 import Int8Linear
from cosyserve.engine.linear_kernels import PREFILL_MIN_ROWS, available_kernels, pack_linear
from cosyserve.engine.lm_layout import PRODUCTS, pack_speech_lm
from cosyserve.engine.native_int8 import (
    NATIVE_INT8_KERNELS,
    NativeInt8Linear,
    build_library,
    cpu_supports_kernel,
    library_path,
    native_int8_available,
)
from cosyserve.model.speech_lm import SpeechLM
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity.llm import teacher_forced_logp

needs_compiler = pytest.mark.skipif(native_int8.compiler() is None, reason="needs a C compiler (gcc)")
# Every native kernel, each skipped where this CPU lacks its instructions or there is no compiler.
KERNELS_HERE = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(
            not (cpu_supports_kernel(kernel=name) and native_int8.compiler() is not None),
            reason=f"needs the CPU instructions of {name} and gcc",
        ),
    )
    for name in NATIVE_INT8_KERNELS
]


def _forget_loading() -> None:
    native_int8.forget_loading()


@pytest.fixture
def fresh_library():
    """Forget the loaded kernels before and after a test that changes what loading finds."""
    _forget_loading()
    yield
    _forget_loading()


@needs_compiler
def test_the_library_builds_once_into_the_kernel_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSYSERVE_KERNEL_DIR", str(tmp_path))
    path = build_library()
    assert path == library_path() and path.parent == tmp_path and path.stat().st_size > 0
    built = path.stat().st_mtime_ns
    assert build_library() == path and path.stat().st_mtime_ns == built  # found, not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no partial files left


def test_a_failing_compiler_is_reported_and_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CC", "false")
    with pytest.raises(RuntimeError, match="failed"):
        build_library(tmp_path)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("CC", "no-such-compiler-anywhere")
    with pytest.raises(RuntimeError, match="no C compiler"):
        build_library(tmp_path)


def test_a_prebuilt_library_needs_no_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    library_path(tmp_path).write_bytes(b"stand-in")
    monkeypatch.setenv("CC", "no-such-compiler-anywhere")
    assert build_library(tmp_path) == library_path(tmp_path)


def test_not_offered_without_the_instructions_or_when_switched_off(fresh_library, monkeypatch) -> None:
    monkeypatch.setattr(native_int8, "cpu_supports_kernel", lambda *_, **__: False)
    for kernel in NATIVE_INT8_KERNELS:
        assert not native_int8_available(kernel) and kernel not in available_kernels()
    _forget_loading()
    monkeypatch.setattr(native_int8, "cpu_supports_kernel", lambda *_, **__: True)
    monkeypatch.setenv("COSYSERVE_NATIVE_KERNELS", "0")
    assert not any(native_int8_available(kernel) for kernel in NATIVE_INT8_KERNELS)
    with pytest.raises(RuntimeError, match="not available"):
        NativeInt8Linear(torch.randn(4, 8), None, kernel="int8_avx2")
    with pytest.raises(ValueError, match="unknown native int8 kernel"):
        NativeInt8Linear(torch.randn(4, 8), None, kernel="int4")


def test_a_build_that_fails_falls_back_with_a_warning(
    fresh_library, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(native_int8, "cpu_supports_kernel", lambda *_, **__: True)
    monkeypatch.setenv("COSYSERVE_KERNEL_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")
    with caplog.at_level(logging.WARNING, logger="cosyserve.engine.native_int8"):
        assert not native_int8_available()
    assert "fbgemm's int8 product serves instead" in caplog.text


def test_cpu_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    here = torch.empty(0).device.type == "cpu" and _linux_x86()
    info.write_text("processor : 0\nflags : fpu sse4_2 avx\n")
    assert not cpu_supports_kernel(str(info))
    info.write_text("processor : 0\nflags : fpu avx2 fma avx512f avx512bw avx512vl\n")
    assert not cpu_supports_kernel(str(info), "int8_vnni")
    assert cpu_supports_kernel(str(info), "int8_avx2") == cpu_supports_kernel(str(info)) == here
    info.write_text("processor : 0\nflags : fpu avx2 fma avx512f avx512bw avx512vl avx512_vnni\n")
    assert cpu_supports_kernel(str(info), "int8_vnni") == here
    assert cpu_supports_kernel(str(info), "gemv_avx2") == here
    with pytest.raises(ValueError, match="unknown native kernel"):
        cpu_supports_kernel(str(info), "int8_amx")


def _linux_x86() -> bool:
    import platform

    return platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")


SHAPES = [(37, 70, True), (48, 64, False), (5, 3, True), (150, 40, True)]  # (out, in, bias): padded to 16, 4


@pytest.mark.parametrize("kernel", KERNELS_HERE)
@pytest.mark.parametrize(("out_features", "in_features"), [(37, 70), (48, 64), (5, 3), (896, 4864)])
@pytest.mark.parametrize("with_norm", [False, True])
def test_the_weights_are_packed_as_torch_packs_them(
    kernel: str, out_features: int, in_features: int, with_norm: bool
) -> None:
    """The C packing (one pass a row) against torch's arithmetic bit for bit: scales, rounding to
    nearest even (ties included), the clamp, padding, the layout and the row sums."""
    generator = torch.Generator().manual_seed(out_features)
    weight = torch.randn(out_features, in_features, generator=generator)
    weight[0, :3] = torch.tensor([2.5, -0.5, 127.0])  # scale 1: two ties to round to even (without a norm)
    weight[-1] = 0.0  # a zero row: the smallest scale
    norm_weight = torch.rand(in_features, generator=generator) + 0.5 if with_norm else None
    layer = NativeInt8Linear(
        weight, None, norm=None if norm_weight is None else (norm_weight, 1e-6), kernel=kernel
    )
    packed, scale, weight_sum = NativeInt8Linear.pack_reference(weight, norm_weight)
    assert torch.equal(layer.packed, packed)
    assert torch.equal(layer.scale, scale) and torch.equal(layer.weight_sum, weight_sum)


@pytest.mark.parametrize("kernel", KERNELS_HERE)
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 70])
@pytest.mark.parametrize(("out_features", "in_features", "bias"), SHAPES)
@pytest.mark.parametrize("with_norm", [False, True])
def test_the_kernel_computes_its_quantised_product_exactly(
    kernel: str, rows: int, out_features: int, in_features: int, bias: bool, with_norm: bool
) -> None:
    """Padding of inputs (to 4) and outputs (to 16), row tiles of 4, calls of at most 64 rows; with an
    RMSNorm in front, computed inside."""
    generator = torch.Generator().manual_seed(rows * 1000 + out_features)
    weight = torch.randn(out_features, in_features, generator=generator)
    norm_weight = torch.rand(in_features, generator=generator) + 0.5
    norm = (norm_weight, 1e-6) if with_norm else None
    layer = NativeInt8Linear(
        weight, torch.randn(out_features, generator=generator) if bias else None, norm=norm, kernel=kernel
    )
    x = torch.randn(rows, in_features, generator=generator) * 3
    got, expected = layer(x), layer.reference(x)
    assert got.shape == (rows, out_features)
    # Exact integer sums; only the float32 rescaling differs from the float64 reference.
    assert float((got - expected).abs().max()) <= 2e-6 * float(expected.abs().max())
    normed = F.rms_norm(x, (in_features,), norm_weight, 1e-6) if with_norm else x
    dense = F.linear(normed, weight, layer.bias)
    assert float((got - dense).norm() / dense.norm()) < 0.03  # int8's own error, ~0.5-1.5 %


@pytest.mark.parametrize("kernel", KERNELS_HERE)
@torch.inference_mode()
def test_the_kernel_agrees_with_fbgemm_and_keeps_the_input_shape(kernel: str) -> None:
    generator = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(896, 1152)
    linear.weight.data = torch.randn(1152, 896, generator=generator) * 0.02
    x = torch.randn(1, 1, 896, generator=generator)
    ours = NativeInt8Linear(linear.weight, linear.bias, kernel=kernel)
    theirs = Int8Linear(linear, reduce_range=kernel == "int8_avx2")
    # One row: the same quantisation as fbgemm's (8-bit activations with VNNI, 7-bit without), so the
    # same values to rounding.
    assert ours(x).shape == (1, 1, 1152)
    assert float((ours(x) - theirs(x)).norm() / theirs(x).norm()) < 1e-5
    # Several rows: each its own activation scale (fbgemm: one for all), never further from float32.
    rows = torch.randn(4, 896, generator=generator) * torch.tensor([[0.1], [1.0], [3.0], [10.0]])
    dense = linear(rows)
    assert float((ours(rows) - dense).norm()) <= float((theirs(rows) - dense).norm())


@pytest.mark.parametrize("kernel", KERNELS_HERE)
def test_a_row_with_nan_comes_out_nan_and_the_others_do_not(kernel: str) -> None:
    layer = NativeInt8Linear(torch.randn(20, 12), None, kernel=kernel)
    x = torch.randn(3, 12)
    x[1, 5] = float("nan")
    out = layer(x)
    assert out[1].isnan().all() and out[[0, 2]].isfinite().all()
    assert layer(x[1:2]).isnan().all() and layer(x[:1]).isfinite().all()  # one row: decoding's path
    assert layer(torch.empty(0, 12)).shape == (0, 20)
    with pytest.raises(ValueError, match="12 features"):
        layer(torch.randn(2, 13))


@pytest.mark.parametrize("kernel", KERNELS_HERE)
def test_packed_as_the_lm_packs_it_fused_parts_and_copies_included(kernel: str) -> None:
    generator = torch.Generator().manual_seed(2)
    gate, up = (torch.randn(64, 32, generator=generator) for _ in range(2))
    x = torch.randn(1, 1, 32, generator=generator)
    fused = pack_linear([gate, up], None, kernel)
    assert fused.kernel == kernel and fused.weight_nbytes == 128 * 32
    separate = torch.cat([pack_linear(w, None, kernel)(x) for w in (gate, up)], dim=-1)
    torch.testing.assert_close(fused(x), separate)
    layer = NativeInt8Linear(gate, None, kernel=kernel)
    torch.testing.assert_close(copy.deepcopy(layer)(x), layer(x))


@pytest.mark.parametrize("kernel", KERNELS_HERE)
def test_an_rms_norm_goes_into_the_product_for_few_rows_and_many(kernel: str) -> None:
    generator = torch.Generator().manual_seed(3)
    weight, norm_weight = torch.randn(40, 24, generator=generator), torch.rand(24, generator=generator) + 0.5
    packed = pack_linear(weight, None, kernel, prefill_bfloat16=True, norm=(norm_weight, 1e-6))
    for rows in (1, PREFILL_MIN_ROWS):  # the kernel, then the bfloat16 copy
        x = torch.randn(rows, 24, generator=generator)
        dense = F.linear(F.rms_norm(x, (24,), norm_weight, 1e-6), weight)
        assert float((packed(x) - dense).norm() / dense.norm()) < 0.03
    with pytest.raises(ValueError, match="gemv_avx2 products only"):
        pack_linear(weight, None, "int8", norm=(norm_weight, 1e-6))


@pytest.mark.parametrize("kernel", KERNELS_HERE)
@pytest.mark.parametrize("prefill_bfloat16", [False, True])
@torch.inference_mode()
def test_the_packed_lm_computes_its_norms_in_the_kernel(
    tiny_dir: Path, prefill_bfloat16: bool, kernel: str
) -> None:
    """Both RMSNorms of every layer move into the products after them; the log-probs stay as close to
    the official ones as fbgemm's int8 products keep them (6.6e-4 both, tiny model, Intel Xeon)."""
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    golden = np.load(tiny_dir / "llm.npz")
    lm_input = torch.from_numpy(golden["lm_input"])[None]
    forced = torch.from_numpy(golden["forced_tokens"]).long()
    deviation = {}
    seven_bits = kernel == "int8_avx2"  # fbgemm then with the same 7-bit activations
    for name in ("int8", kernel):
        llm = SpeechLM.from_checkpoint(model_dir.file("llm.pt"), model_dir.config.llm)
        kernels = {**dict.fromkeys(PRODUCTS, name), "llm_decoder": "fp16"}
        pack_speech_lm(
            llm, "fast", kernels=kernels, reduce_range=seven_bits, prefill_bfloat16=lambda _: prefill_bfloat16
        )
        layer = llm.qwen2.layers[0]
        norms_moved = isinstance(layer.input_layernorm, torch.nn.Identity)
        assert (
            norms_moved == isinstance(layer.post_attention_layernorm, torch.nn.Identity) == (name == kernel)
        )
        logp = teacher_forced_logp(llm, lm_input, forced).numpy()
        deviation[name] = float(np.abs(logp - golden["logp"]).max())
    assert deviation[kernel] <= max(1.25 * deviation["int8"], 1e-3), deviation
