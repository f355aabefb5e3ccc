"""The DiT feed-forward's tanh-GELU in one compiled call, for the CPU flow.

Why: torch's CPU GELU evaluates SLEEF's tanh value by value; on an AVX2-only AMD EPYC (2 threads) one
feed-forward's 1600 x 2048 values took 17-18 ms of it against 4 ms here, 22 of them a DiT pass, 10
passes a sentence. `native/activations.c` computes the same function as x / (1 + exp(-2c(x + 0.044715
x^3))) with a polynomial exponential (see its header): within 5e-7 of torch's values on normal inputs,
the same infinities, NaNs and signed zeros.

`use_compiled_gelu` puts a `CompiledGelu` in place of every DiT block's `nn.GELU(approximate="tanh")`
where the kernel runs (avx2 and fma in /proc/cpuinfo, the library built and loaded, a check at load);
`loading.place_flow` does so on CPU float32 placements. Inputs it does not take (another dtype or
device, a tensor that needs gradients, a non-contiguous one) go through torch's GELU. The bfloat16 DiT
replaces the whole hidden layer, GELU included (`bfloat16_dit`), and the int8 one its product only, so
the compiled GELU serves the exact and int8 flows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosyserve.engine.native_int8 import availability, avx2_kernel_runs, native_library
from cosyserve.engine.quantize import replace_modules

__all__ = ["CompiledGelu", "native_gelu_available", "use_compiled_gelu"]

_CHECK_TOLERANCE = 1e-6  # absolute, on values of magnitude up to ~10: torch's and ours differ by ulps


@availability
def native_gelu_available() -> bool:
    """Whether the compiled GELU runs here (see the module docstring)."""
    return avx2_kernel_runs("compiled GELU", _self_check, "torch's serves")


def use_compiled_gelu(model: nn.Module) -> int:
    """Replace every `nn.GELU(approximate="tanh")` under `model` by a `CompiledGelu` where it runs;
    return how many (0 where it does not run here)."""
    if not native_gelu_available():
        return 0
    return replace_modules(
        model,
        lambda _name, module: isinstance(module, nn.GELU) and module.approximate == "tanh",
        lambda _gelu: CompiledGelu(),
    )


class CompiledGelu(nn.Module):
    """`nn.GELU(approximate="tanh")` through the compiled kernel: `(...)` float32 -> the same shape."""

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.requires_grad or not x.is_contiguous():
            return F.gelu(x, approximate="tanh")
        library = native_library()
        if library is None:
            return F.gelu(x, approximate="tanh")
        out = torch.empty_like(x)
        if library.cosyserve_gelu_tanh(x.data_ptr(), out.data_ptr(), x.numel(), torch.get_num_threads()):
            return F.gelu(x, approximate="tanh")
        return out

    def extra_repr(self) -> str:
        return "approximate='tanh', compiled"


def _self_check() -> None:
    """Values over the range a feed-forward sees, a tail of fewer than 8, and the special values."""
    generator = torch.Generator().manual_seed(0)
    x = torch.cat((torch.randn(1003, generator=generator) * 4, torch.linspace(-12, 12, 200)))
    special = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, -200.0, 200.0])
    with torch.inference_mode():
        got, expected = CompiledGelu()(x), F.gelu(x, approximate="tanh")
        error = float((got - expected).abs().max())
        if not error < _CHECK_TOLERANCE:
            raise RuntimeError(f"the compiled GELU disagrees with torch's (absolute {error:.2e})")
        got, expected = CompiledGelu()(special), F.gelu(special, approximate="tanh")
        same = torch.equal(got.isnan(), expected.isnan()) and torch.equal(
            got.nan_to_num(), expected.nan_to_num()
        )
        numbers = ~expected.isnan()  # a NaN's sign is the arithmetic's, not the function's
        if not same or not torch.equal(got.signbit()[numbers], expected.signbit()[numbers]):
            raise RuntimeError(f"the compiled GELU gives {got.tolist()} for {special.tolist()}")
