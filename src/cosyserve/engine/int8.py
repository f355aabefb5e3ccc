"""Int8 products on the CPU (fbgemm): weights quantised once per output channel (symmetric),
activations per call (one scale per tensor), accumulated in int32 and rescaled to float32; and the
activation range this CPU can use without saturating (`check_reduce_range`).
"""

from __future__ import annotations

import os
import warnings

import torch
from torch import Tensor, nn

from cosyserve.errors import InputError


class Int8Linear(nn.Module):
    """`nn.Linear` with int8 weights (per output channel) and per-call int8 activations (fbgemm, CPU).

    `(..., in_features)` float32 → `(..., out_features)` float32.
    """

    def __init__(self, linear: nn.Linear, reduce_range: bool | None = None) -> None:
        super().__init__()
        self._pack(linear.weight, linear.bias, reduce_range)

    @classmethod
    def from_weight(cls, weight: Tensor, bias: Tensor | None, reduce_range: bool | None = None) -> Int8Linear:
        """The same from a `(out, in)` weight and an optional `(out,)` bias."""
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module._pack(weight, bias, reduce_range)
        return module

    def _pack(self, weight: Tensor, bias: Tensor | None, reduce_range: bool | None) -> None:
        self.out_features, self.in_features = weight.shape
        self.reduce_range = check_reduce_range(reduce_range)
        weight = weight.detach().float()
        scales = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12).double()
        bias = None if bias is None else bias.detach().float().clone()
        with warnings.catch_warnings():
            # torch marks quantised tensor creation as deprecated; fbgemm's packed kernels still take it.
            warnings.simplefilter("ignore")
            zero_points = torch.zeros(weight.shape[0], dtype=torch.long)
            qweight = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(qweight, bias)

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.quantized.linear_dynamic(x.float().contiguous(), self._packed, self.reduce_range)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def int8_available() -> bool:
    """Whether this torch build has the fbgemm int8 linear kernels the fast preset needs."""
    try:
        return hasattr(torch.ops.quantized, "linear_dynamic") and "fbgemm" in (
            torch.backends.quantized.supported_engines
        )
    except (AttributeError, RuntimeError):
        return False


# fbgemm's own cap on the instructions it uses (FBGEMM_ENABLE_INSTRUCTIONS); these values keep VNNI.
_FBGEMM_VNNI_SETTINGS = ("AVX512_E1", "AVX512_E1_256")
_FBGEMM_CAP_SETTINGS = ("AVX2", "AVX512", "AVX512_256", *_FBGEMM_VNNI_SETTINGS)


def cpu_has_vnni(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether fbgemm's int8 products run on AVX-512 VNNI here: the CPU has it (Linux) and fbgemm's
    instruction cap (`FBGEMM_ENABLE_INSTRUCTIONS`, an unknown value is ignored as fbgemm does) keeps it."""
    cap = os.environ.get("FBGEMM_ENABLE_INSTRUCTIONS")
    if cap in _FBGEMM_CAP_SETTINGS and cap not in _FBGEMM_VNNI_SETTINGS:
        return False
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as info:
            return any(line.startswith("flags") and " avx512_vnni" in line for line in info)
    except OSError:
        return False


def check_reduce_range(reduce_range: bool | None) -> bool:
    """The activation range for int8 products on this CPU: None chooses (7-bit without VNNI, 8-bit with).

    Without VNNI, fbgemm multiplies uint8 activations by int8 weights and adds adjacent pairs in int16
    (`vpmaddubsw`), which saturates for 8-bit activations (relative error ~0.2 measured on AVX2); 7-bit
    activations cannot reach the int16 limit. So 8-bit is refused (InputError) where it would saturate.
    """
    vnni = cpu_has_vnni()
    if reduce_range is None:
        return not vnni
    if not reduce_range and not vnni:
        raise InputError(
            "8-bit int8 activations (reduce_range=False) saturate fbgemm's int8 multiply-add on a CPU "
            "without AVX-512 VNNI: use reduce_range=True (7-bit) or leave it to the default"
        )
    return reduce_range
