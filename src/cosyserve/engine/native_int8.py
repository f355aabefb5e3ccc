"""Int8 products for LM decoding in a small C kernel for AVX-512 VNNI or AVX2, compiled on first use.

Why: a decoding step reads every weight once, so int8 decoding runs at the speed its products stream
0.36 GB of weights. This kernel lays the weights out in the order `vpdpbusd` reads them (16 outputs x 4
inputs per 64-byte load), so each thread reads one contiguous stretch, and prefetches them into L2
only, so that the small operations between products keep more of their data in L1. On an Intel Xeon
with AMX (2 threads, the full-size LM at position ~250) a decoding step took 21.2-21.3 ms with it
against 23.6-25.0 ms with fbgemm's int8 product (the products themselves 14.0 against 16.4 ms: 26 GB/s,
79 % of the 33 GB/s `bench` measures), `native/int8_products.c`.

Two kernels share the layout and the library: `int8_vnni` (`vpdpbusd`, 8-bit activations) and
`int8_avx2` (`vpmaddubsw` + `vpmaddwd`, for CPUs without VNNI: 7-bit activations, as fbgemm's there,
so that no pair of products saturates int16).

An RMSNorm in front of a product can be computed inside it (`norm=`; the LM's two per layer, which
cost 1.7 ms of a 21 ms step as calls of their own: 19.3-20.1 ms a step with them inside): the norm's
weight is folded into the int8 weights, and each row's 1 / rms scales its activation scale.

Same arithmetic as `int8.Int8Linear` (weights symmetric int8 per output channel, 8-bit activations
with a zero point on VNNI CPUs and 7-bit ones on others, exact int32 sums), except that each row of a
batch gets its own activation scale (fbgemm: one per call), which is never less precise.

The same library holds the float32 one-row product of `native_f32` (`native/f32_products.c`), the
one-position attention of `native_attention` (`native/attention.c`), the decoding step through every
layer of `native_step` (`native/decode_step.c`), the DiT's GELU of `native_activation`
(`native/activations.c`) and its bfloat16 attention of `native_dit_attention` (`native/dit_attention.c`):
one build, one load, one switch. It is compiled with the system C compiler
(`$CC`, else `cc` or `gcc`) into `$COSYSERVE_KERNEL_DIR` (default: `kernels/` where `calibration/` is by
default), named by a hash of the sources and flags (`python -m cosyserve.engine.native_int8` builds it
ahead, as the CPU Docker image does), and loaded after torch so that it shares torch's OpenMP runtime
(one thread pool, not two spinning against each other). A kernel is offered where /proc/cpuinfo lists
its instructions and the loaded library's product agrees with a reference; where there is neither a
built library nor a compiler, the build fails, or `COSYSERVE_NATIVE_KERNELS=0`, neither is offered
(logged once) and the calibration chooses among the others (`linear_kernels`); where one is offered, the
calibration measures it like the others.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

__all__ = ["NATIVE_INT8_KERNELS", "NativeInt8Linear", "kernel_dir", "native_int8_available"]

log = logging.getLogger(__name__)

SOURCES = tuple(
    Path(__file__).with_name("native") / name
    for name in (
        "int8_products.c",
        "f32_products.c",
        "attention.c",
        "decode_step.c",
        "activations.c",
        "dit_attention.c",
    )
)
HEADERS = (Path(__file__).with_name("native") / "vector_exp.h",)  # included by the sources
KERNEL_DIR_ENV = "COSYSERVE_KERNEL_DIR"
SWITCH_ENV = "COSYSERVE_NATIVE_KERNELS"  # "0" turns the compiled kernels off
# Per kernel in the library: the instructions it needs (/proc/cpuinfo's names); then the int8 ones' C
# functions and activation levels.
REQUIRED_FLAGS = {
    "int8_vnni": ("avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
    "int8_avx2": ("avx2", "fma"),
    "gemv_avx2": ("avx2", "fma"),  # native_f32
    "attention_bf16": ("avx512f", "avx512bw", "avx512vl", "avx512_bf16"),  # native_dit_attention
}
NATIVE_INT8_KERNELS = ("int8_vnni", "int8_avx2")
_FUNCTIONS = {"int8_vnni": "cosyserve_int8_linear", "int8_avx2": "cosyserve_int8_linear_avx2"}
_LEVELS = {"int8_vnni": 255, "int8_avx2": 127}
ABI = 6  # the C file's cosyserve_int8_abi(): bumped when a signature changes
CFLAGS = ("-O3", "-fno-math-errno", "-fPIC", "-shared", "-fopenmp")
COMPILE_TIMEOUT_S = 120
BLOCK = 16  # outputs per block of the packed layout (the C file's BLOCK)
MAX_ROWS = 64  # rows per call (the C file's MAX_ROWS)


def kernel_dir(environ: dict[str, str] | None = None) -> Path:
    """`$COSYSERVE_KERNEL_DIR`, else `kernels/` beside the default calibration cache (under
    `$COSYSERVE_HOME`, `$XDG_CACHE_HOME/cosyserve` or `~/.cache/cosyserve`)."""
    from cosyserve.modeldir.download import default_models_root

    env = dict(os.environ) if environ is None else environ
    if env.get(KERNEL_DIR_ENV):
        return Path(env[KERNEL_DIR_ENV]).expanduser()
    return default_models_root(env).parent / "kernels"


_AVAILABILITY: list[functools._lru_cache_wrapper] = []  # each kernel's cached "does it run here"


def availability(check: Callable[..., bool]) -> functools._lru_cache_wrapper:
    """`functools.cache` for a kernel's availability check, forgotten with the library by
    `forget_loading` (tests that switch the kernels off and on again)."""
    cached = functools.cache(check)
    _AVAILABILITY.append(cached)
    return cached


def avx2_kernel_runs(name: str, self_check: Callable[[], None], instead: str) -> bool:
    """Whether the AVX2 kernel `name` runs here: avx2 and fma listed, the library built and loaded, and
    `self_check()` passing (a RuntimeError or ValueError it raises is logged, saying that `instead`
    serves). Wrap the caller in `availability` so that this runs once."""
    if not cpu_supports_kernel(kernel="gemv_avx2") or native_library() is None:
        return False
    try:
        self_check()
    except (RuntimeError, ValueError) as exc:
        log.warning("%s unavailable, %s instead: %s", name, instead, exc)
        return False
    return True


def forget_loading() -> None:
    """Forget the loaded library and every availability answer: the next call looks again."""
    native_library.cache_clear()
    for cached in _AVAILABILITY:
        cached.cache_clear()


@availability
def native_int8_available(kernel: str = "int8_vnni") -> bool:
    """Whether `kernel` runs here: its instructions listed, the library built and loaded, and its
    product checked against the reference (see the module docstring)."""
    if not cpu_supports_kernel(kernel=kernel):
        return False
    library = native_library()
    if library is None:
        return False
    try:
        _self_check(library, kernel)
    except RuntimeError as exc:
        log.warning("int8 kernel %s unavailable, fbgemm's int8 product serves instead: %s", kernel, exc)
        return False
    return True


def cpu_supports_kernel(cpuinfo: str = "/proc/cpuinfo", kernel: str | None = None) -> bool:
    """Whether this is a Linux x86-64 CPU with the instructions `kernel` uses (None: any kernel of the
    library)."""
    if kernel is not None and kernel not in REQUIRED_FLAGS:
        raise ValueError(f"unknown native kernel {kernel!r}: one of {', '.join(REQUIRED_FLAGS)}")
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as info:
            flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    except OSError:
        return False
    kernels = tuple(REQUIRED_FLAGS) if kernel is None else (kernel,)
    return any(all(flag in flags for flag in REQUIRED_FLAGS[name]) for name in kernels)


def compiler() -> str | None:
    """The C compiler to build with: `$CC`, else `cc` or `gcc` on the PATH."""
    named = os.environ.get("CC")
    if named:
        return shutil.which(named) or None
    return shutil.which("cc") or shutil.which("gcc")


def library_path(directory: Path | None = None) -> Path:
    """Where the library built from this source and these flags lies (or will): named by their hash,
    so a library built elsewhere (a Docker image's build stage) is found without a compiler."""
    return (kernel_dir() if directory is None else directory) / f"products-{source_digest()}.so"


@functools.cache
def source_digest() -> str:
    """16 hex digits naming the kernels' sources and flags (the library's name; the calibration's key)."""
    files = b"".join(source.read_bytes() for source in (*SOURCES, *HEADERS))
    digest = hashlib.sha256(files + " ".join(CFLAGS).encode())
    return digest.hexdigest()[:16]


def build_library(directory: Path | None = None) -> Path:
    """The compiled kernel in `directory` (default `kernel_dir()`), built first unless it is there.

    Raises RuntimeError with the compiler's last line when there is no compiler or the build fails."""
    path = library_path(directory)
    if path.exists():
        return path
    cc = compiler()
    if cc is None:
        raise RuntimeError(f"no C compiler found to build {path.name} (set CC, or install gcc)")
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written under another name and renamed: two processes building at once both end with a whole file.
    handle, partial = tempfile.mkstemp(dir=path.parent, prefix=".products-", suffix=".so")
    os.close(handle)
    try:
        result = subprocess.run(
            [cc, *CFLAGS, "-o", partial, *map(str, SOURCES)],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            lines = (result.stderr or result.stdout).strip().splitlines()
            raise RuntimeError(f"{cc} failed: {lines[-1] if lines else f'exit {result.returncode}'}")
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return path


@functools.lru_cache(maxsize=1)
def native_library() -> ctypes.CDLL | None:
    """The loaded library, or None (the reason logged once)."""
    if os.environ.get(SWITCH_ENV, "1") == "0":
        log.info("compiled int8 kernels: off (%s=0)", SWITCH_ENV)
        return None
    if not cpu_supports_kernel():
        return None
    try:
        library = ctypes.CDLL(str(build_library()))
        _declare(library)
    except (OSError, RuntimeError, AttributeError, subprocess.SubprocessError) as exc:
        log.warning("compiled int8 kernels unavailable, fbgemm's int8 product serves instead: %s", exc)
        return None
    return library


def _declare(library: ctypes.CDLL) -> None:
    if library.cosyserve_int8_abi() != ABI:
        raise RuntimeError("the compiled kernel has another calling convention than this module")
    pointer, integer = ctypes.c_void_p, ctypes.c_int
    for name in _FUNCTIONS.values():
        product = getattr(library, name)
        product.argtypes = [pointer, integer, integer, integer, pointer, pointer, pointer, pointer, pointer]
        product.argtypes += [integer, integer, pointer, ctypes.c_float]
        product.restype = integer
    float_product = library.cosyserve_f32_linear_avx2
    float_product.argtypes = [pointer, integer, integer, pointer, pointer, pointer, integer, integer]
    float_product.argtypes += [pointer, ctypes.c_float, pointer]
    float_product.restype = integer
    attention = library.cosyserve_attend_new_position
    longer = ctypes.c_long
    attention.argtypes = [
        pointer,
        longer,
        pointer,
        longer,
        pointer,
        longer,
        integer,
        integer,
        integer,
        integer,
    ]
    attention.argtypes += [
        pointer,
        pointer,
        pointer,
        pointer,
        longer,
        longer,
        integer,
        pointer,
        pointer,
        integer,
    ]
    attention.restype = integer
    step = library.cosyserve_decode_layers
    step.argtypes = [pointer, integer, pointer, integer, integer, integer, integer, integer, integer, pointer]
    step.argtypes += [longer, longer, longer, longer, pointer, pointer, pointer, pointer, pointer, integer]
    step.restype = integer
    pack = library.cosyserve_int8_pack
    pack.argtypes = [pointer, integer, integer, integer, pointer, pointer, pointer, pointer, integer]
    pack.restype = integer
    gelu = library.cosyserve_gelu_tanh
    gelu.argtypes = [pointer, pointer, longer, integer]
    gelu.restype = integer
    dit_attention = library.cosyserve_dit_attention_bf16
    dit_attention.argtypes = [pointer, pointer, pointer, pointer, pointer, pointer]
    dit_attention.argtypes += [integer, integer, integer, integer, integer, pointer, integer]
    dit_attention.restype = integer


def _self_check(library: ctypes.CDLL, kernel: str) -> None:
    """One product against the same quantised arithmetic in torch (exact sums, so ~1e-6 apart)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(37, 70, generator=generator)
    bias = torch.randn(37, generator=generator)
    x = torch.randn(6, 70, generator=generator)
    for norm in (None, (torch.rand(70, generator=generator) + 0.5, 1e-6)):
        layer = NativeInt8Linear(weight, bias, library=library, norm=norm, kernel=kernel)
        got, expected = layer(x), layer.reference(x)
        error = float((got - expected).abs().max()) / max(float(expected.abs().max()), 1e-12)
        if not error < 1e-5:
            raise RuntimeError(f"the compiled kernel disagrees with the reference (relative {error:.2e})")


class NativeInt8Linear(nn.Module):
    """`x @ weight.T + bias` with int8 weights in the kernels' layout (see the module docstring), by
    `kernel` (`int8_vnni` or `int8_avx2`).

    weight `(out, in)`, bias `(out,)` or None; `(..., in)` float32 -> `(..., out)` float32. `norm`:
    `(norm_weight (in,), eps)` of an RMSNorm that precedes the product, computed inside it:
    `rms_norm(x) @ weight.T + bias`, the norm's weight folded into `weight` before quantising (a
    decoding step's RMSNorm calls cost 1.7 ms of 22 in a step of their own).
    """

    def __init__(
        self,
        weight: Tensor,
        bias: Tensor | None,
        library: ctypes.CDLL | None = None,
        *,
        norm: tuple[Tensor, float] | None = None,
        kernel: str = "int8_vnni",
    ) -> None:
        super().__init__()
        if kernel not in _FUNCTIONS:
            raise ValueError(f"unknown native int8 kernel {kernel!r}: one of {', '.join(_FUNCTIONS)}")
        self.kernel, self.levels = kernel, _LEVELS[kernel]
        # Kept only when given (the self-check, before the cache holds it): a loaded library does not
        # copy or pickle, and a module may be deep-copied.
        self._given_library = library
        if library is None and not native_int8_available(kernel):
            raise RuntimeError(f"the {kernel} kernel is not available on this machine")
        weight = weight.detach().float().contiguous()
        norm_weight = None if norm is None else norm[0].detach().float().contiguous()
        self.norm_eps = -1.0 if norm is None else float(norm[1])  # < 0: no norm (the C file's norm_eps)
        self.out_features, self.in_features = weight.shape
        if norm_weight is not None and norm_weight.shape != (self.in_features,):
            raise ValueError(f"a norm of {tuple(norm_weight.shape)} weights before {self.in_features} inputs")
        self.padded_in = -(-self.in_features // 4) * 4
        padded_out = -(-self.out_features // BLOCK) * BLOCK
        packed = torch.zeros(padded_out * self.padded_in, dtype=torch.int8)
        scale = torch.empty(self.out_features)
        weight_sum = torch.empty(self.out_features, dtype=torch.int32)
        status = (library or native_library()).cosyserve_int8_pack(  # `pack_reference` in torch
            weight.data_ptr(),
            self.out_features,
            self.in_features,
            self.padded_in,
            None if norm_weight is None else norm_weight.data_ptr(),
            packed.data_ptr(),
            scale.data_ptr(),
            weight_sum.data_ptr(),
            torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError(f"the {kernel} kernel could not pack a {tuple(weight.shape)} weight")
        self.register_buffer("packed", packed, persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("weight_sum", weight_sum, persistent=False)
        bias = None if bias is None else bias.detach().float().contiguous()
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        # Kept lean: a decoding step makes ~100 of these calls, and tensor indexing or a copy here
        # costs as much as a small product's kernel (5 us each).
        in_features, out_features = self.in_features, self.out_features
        if x.shape[-1] != in_features:
            raise ValueError(f"expected inputs of {in_features} features, got {tuple(x.shape)}")
        flat = x.reshape(-1, in_features)
        if flat.dtype != torch.float32 or not flat.is_contiguous():
            flat = flat.float().contiguous()
        rows = flat.shape[0]
        out = torch.empty(rows, out_features)
        if rows == 0:
            return out.view(*x.shape[:-1], out_features)
        library = self._given_library or native_library()
        if library is None:
            raise RuntimeError(f"the {self.kernel} kernel is not available on this machine")
        product = getattr(library, _FUNCTIONS[self.kernel])
        threads = torch.get_num_threads()
        scratch = torch.empty(min(rows, MAX_ROWS) * self.padded_in, dtype=torch.uint8)
        bias = 0 if self.bias is None else self.bias.data_ptr()
        packed, scale, weight_sum = self.packed.data_ptr(), self.scale.data_ptr(), self.weight_sum.data_ptr()
        x_at, out_at, scratch_at = flat.data_ptr(), out.data_ptr(), scratch.data_ptr()
        for start in range(0, rows, MAX_ROWS):  # float32: 4 bytes a value
            count = min(MAX_ROWS, rows - start)
            status = product(
                x_at + 4 * start * in_features,
                count,
                in_features,
                self.padded_in,
                packed,
                scale,
                weight_sum,
                bias,
                out_at + 4 * start * out_features,
                out_features,
                threads,
                scratch_at,
                self.norm_eps,
            )
            if status != 0:
                raise RuntimeError(f"the {self.kernel} kernel refused a {count}x{in_features} input")
        return out.view(*x.shape[:-1], out_features)

    @staticmethod
    def pack_reference(weight: Tensor, norm_weight: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """What the C file's `cosyserve_int8_pack` computes, in torch (tests): the packed layout, the
        scales and the row sums of `weight` `(out, in)` (times `norm_weight` per input)."""
        weight = weight.float() if norm_weight is None else weight.float() * norm_weight.float()[None, :]
        out_features, in_features = weight.shape
        padded_in = -(-in_features // 4) * 4
        scale = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
        quantized = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        padded_out = -(-out_features // BLOCK) * BLOCK
        padded = torch.zeros(padded_out, padded_in, dtype=torch.int8)
        padded[:out_features, :in_features] = quantized
        # (blocks, 16, groups, 4) -> (blocks, groups, 16, 4): one 64-byte load per block and group.
        layout = padded.view(padded_out // BLOCK, BLOCK, padded_in // 4, 4).permute(0, 2, 1, 3)
        return layout.contiguous().view(-1), scale, quantized.sum(dim=1, dtype=torch.int32)

    def dequantized_weight(self) -> Tensor:
        """The `(out, in)` float32 weight this computes with (int8 values times their scales)."""
        blocks = self.packed.view(-1, self.padded_in // 4, BLOCK, 4).permute(0, 2, 1, 3)
        blocks = blocks.reshape(-1, self.padded_in)
        return blocks[: self.out_features, : self.in_features].float() * self.scale[:, None]

    def reference(self, x: Tensor) -> Tensor:
        """The same product in torch, for checks: rows quantised as the kernel does, exact int sums."""
        flat = x.reshape(-1, self.in_features).float()
        # float32 steps in the kernel's order, so that every rounding to a level is the kernel's
        low = flat.amin(dim=1, keepdim=True).clamp(max=0)
        step = (flat.amax(dim=1, keepdim=True).clamp(min=0) - low) / self.levels
        step = torch.where(step > 0, step, torch.ones_like(step))
        inverse = 1 / step
        zero = torch.round(-low * inverse).clamp(0, self.levels)
        levels = (torch.round(flat * inverse) + zero).clamp(0, self.levels)
        weight = torch.round(self.dequantized_weight().double() / self.scale.double()[:, None])
        sums = (levels - zero).double() @ weight.t()
        out = sums * step.double() * self.scale.double()
        if self.norm_eps >= 0:  # the norm scales each row's output by its 1 / rms (its weight is folded)
            out = out * torch.rsqrt(flat.double().square().mean(dim=1, keepdim=True) + self.norm_eps)
        out = out if self.bias is None else out + self.bias.double()
        return out.float().view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 ({self.kernel})"


def main(argv: list[str] | None = None) -> int:
    """`python -m cosyserve.engine.native_int8 [DIR]`: build the library (into DIR) and print its path."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    try:
        print(build_library(Path(args[0]) if args else None))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
