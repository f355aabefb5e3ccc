"""Causal F0 predictor of the CosyVoice3 vocoder: mel (50 Hz) → fundamental frequency per frame.

Five convolutions with ELU and a linear read-out. The first convolution looks 3 frames ahead, the
others look only back, so the prediction for a frame never changes once its look-ahead has arrived.
The official code runs this network in float64 because its output drives a phase accumulator whose
rounding errors would otherwise grow with the audio length; every layer here computes in the dtype of
its input, and `CausalF0Predictor.forward` casts the input to float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cosyserve.model.config import F0PredictorConfig

F0_CONV_LAYERS = 5
F0_LOOKAHEAD_KERNEL = 4  # the first conv sees the current frame and 3 future frames
F0_KERNEL = 3


def conv_in_input_dtype(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """Apply `conv` (already padded input) with its weights cast to the dtype of `x`.

    The cast is a no-op when the dtypes agree; it lets the F0 predictor compute in float64 while its
    weights stay in the model's dtype (a later `.to(dtype)` of the vocoder must not undo float64).
    """
    weight = conv.weight.to(x.dtype)
    bias = None if conv.bias is None else conv.bias.to(x.dtype)
    return F.conv1d(x, weight, bias, conv.stride, 0, conv.dilation, conv.groups)


class CausalConv1d(nn.Conv1d):
    """Stride-1 convolution that only looks back: `(kernel_size - 1) * dilation` zeros padded on the left.

    (B, C_in, T) → (B, C_out, T)
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1) -> None:
        super().__init__(in_channels, out_channels, kernel_size, dilation=dilation)
        self.left_context = (kernel_size - 1) * dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv_in_input_dtype(self, F.pad(x, (self.left_context, 0)))


class LookAheadConv1d(nn.Conv1d):
    """Stride-1 convolution over the current frame and `kernel_size - 1` future frames.

    finalize=True: the input is the whole utterance, zeros stand in for frames after its end,
    (B, C_in, T) → (B, C_out, T). finalize=False: the last `look_ahead` input frames are context only,
    (B, C_in, T) → (B, C_out, T - look_ahead).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size)
        self.look_ahead = kernel_size - 1

    def forward(self, x: torch.Tensor, finalize: bool) -> torch.Tensor:
        if finalize:
            x = F.pad(x, (0, self.look_ahead))
        return conv_in_input_dtype(self, x)


class CausalF0Predictor(nn.Module):
    """`f0_predictor.*` of `hift.pt`: mel → F0 in Hz (non-negative), computed in float64.

    Parameter names follow the checkpoint: `condnet.{0,2,4,6,8}` are the convolutions (the odd
    indices are the parameter-free ELUs between them), `classifier` the read-out.
    """

    def __init__(self, config: F0PredictorConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            LookAheadConv1d(config.in_channels, config.cond_channels, F0_LOOKAHEAD_KERNEL),
            nn.ELU(),
        ]
        for _ in range(F0_CONV_LAYERS - 1):
            layers += [CausalConv1d(config.cond_channels, config.cond_channels, F0_KERNEL), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(config.cond_channels, config.num_class)

    @property
    def look_ahead(self) -> int:
        """Mel frames at the end that finalize=False consumes as context without predicting them."""
        return F0_LOOKAHEAD_KERNEL - 1

    def forward(self, mel: torch.Tensor, finalize: bool = True) -> torch.Tensor:
        """mel (B, 80, T) → F0 (B, T) in float64; (B, T - look_ahead) when finalize is False."""
        x = mel.to(torch.float64)
        first, *rest = self.condnet
        x = first(x, finalize)
        for layer in rest:
            x = layer(x)
        weight, bias = self.classifier.weight.to(x.dtype), self.classifier.bias.to(x.dtype)
        # num_class is 1: the single output channel is the F0; abs keeps it non-negative.
        return F.linear(x.transpose(1, 2), weight, bias).squeeze(-1).abs()
