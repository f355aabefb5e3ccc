"""Resampling, and the one place that decides which resampler is used where.

- `prompt_resample`: prompt audio on its way to the speech tokenizer, the speaker encoder (16 kHz) and the
  flow's prompt mel (24 kHz). The official code resamples with `torchaudio.transforms.Resample(orig, new)` at
  its defaults, and the features (hence the speech tokens and the voice) follow the filter closely: a
  different filter changes a 22.05 kHz prompt by 3e-2. So prompts go through `sinc_resample`, that
  resampler rebuilt in torch from its definition (below). Used by every prompt path: API, UI, CLI, voices
  and workers all reach it through `frontend.prompt_features`.
- `output_resample`: generated 24 kHz audio converted to another rate for a download or a stream. There is
  no official counterpart to match, so it keeps soxr's high-quality filter (steeper, and streamable with
  `soxr.ResampleStream` at `OUTPUT_SOXR_QUALITY`).

The official resampler (Hann-windowed sinc interpolation): with g = gcd(orig, new), p = orig / g and
q = new / g, output sample q*b + j (block b, phase j < q) is a dot product of the input samples
p*b - w .. p*b + p + w - 1 (zero outside the signal) with the phase-j filter, where the low-pass cutoff is
c = rolloff * min(p, q) (in cycles per block of p input samples), w = ceil(zeros * p / c), and the filter
tap for input offset i in [-w, w + p) is, with t = clamp(c * (i / p - j / q), -zeros, zeros):
    h_j(i) = (c / p) * sinc(t) * cos(pi * t / (2 * zeros))**2,   sinc(t) = sin(pi t) / (pi t).
The output is cut to ceil(N * q / p) samples. The taps are computed in float64 and stored in float32; the
official computes j / q in float32 (an integer tensor divided in the default dtype) before adding it in
float64, and this does the same, which keeps the two within float32 rounding of each other.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np
import soxr

from cosyserve.errors import InputError

if TYPE_CHECKING:  # torch is imported where prompts are resampled: output conversion must not need it
    import torch

ZERO_CROSSINGS = 6  # torchaudio's lowpass_filter_width default
ROLLOFF = 0.99  # torchaudio's default: cutoff at 99 % of the lower Nyquist frequency
# A rate pair with a small gcd needs a huge filter bank (q filters of 2w + p taps): 11127 -> 16000 Hz would
# take 178 M taps (713 MB). Beyond this many taps the prompt is resampled with soxr instead: no parity with
# the official code (which would need that memory), but a usable prompt. Every common rate pair fits:
# 44.1 kHz -> 16 kHz has 76 k taps, 11.025 kHz -> 16 kHz 291 k.
MAX_KERNEL_TAPS = 1 << 20
KERNEL_CACHE_SIZE = 16  # filter banks kept (per rate pair, device and dtype), least recently used dropped
OUTPUT_SOXR_QUALITY = "HQ"

_cache: OrderedDict[tuple[int, int, str, torch.dtype], torch.Tensor] = OrderedDict()
_cache_lock = threading.Lock()


def reduced_rates(orig_rate: int, new_rate: int) -> tuple[int, int]:
    """(p, q): the two rates divided by their greatest common divisor."""
    if orig_rate <= 0 or new_rate <= 0:
        raise InputError(f"sample rates must be positive, got {orig_rate} -> {new_rate} Hz")
    g = math.gcd(int(orig_rate), int(new_rate))
    return int(orig_rate) // g, int(new_rate) // g


def kernel_width(orig: int, new: int) -> int:
    """w: input samples the filter reaches beyond each block of p samples, on either side."""
    return math.ceil(ZERO_CROSSINGS * orig / (ROLLOFF * min(orig, new)))


def kernel_taps(orig_rate: int, new_rate: int) -> int:
    """How many filter taps `sinc_kernel` needs for this rate pair: q * (2w + p)."""
    orig, new = reduced_rates(orig_rate, new_rate)
    return new * (2 * kernel_width(orig, new) + orig)


def sinc_kernel(orig: int, new: int) -> torch.Tensor:
    """The filter bank for reduced rates p = `orig`, q = `new`: (q, 1, 2w + p) float32 on the CPU."""
    import torch

    cutoff = ROLLOFF * min(orig, new)
    width = kernel_width(orig, new)
    inputs = torch.arange(-width, width + orig, dtype=torch.float64) / orig  # (2w + p,) input times
    phases = (torch.arange(0, -new, -1, dtype=torch.float32) / new).to(torch.float64)  # (q,), as official
    t = ((phases[:, None] + inputs[None, :]) * cutoff).clamp(-ZERO_CROSSINGS, ZERO_CROSSINGS)
    window = torch.cos(t * (math.pi / (2 * ZERO_CROSSINGS))) ** 2
    taps = torch.sinc(t) * window * (cutoff / orig)
    return taps.to(torch.float32)[:, None, :]


def _cached_kernel(orig: int, new: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """`sinc_kernel` built once per rate pair, kept per device and dtype (thread-safe, LRU)."""
    import torch

    key = (orig, new, str(device), dtype)
    with _cache_lock:
        kernel = _cache.get(key)
        if kernel is not None:
            _cache.move_to_end(key)
            return kernel
        cpu_key = (orig, new, "cpu", torch.float32)
        base = _cache.get(cpu_key)
        if base is None:
            base = sinc_kernel(orig, new)
        kernel = base.to(device=device, dtype=dtype)
        _cache[key] = kernel
        if key != cpu_key and cpu_key not in _cache:
            _cache[cpu_key] = base
        while len(_cache) > KERNEL_CACHE_SIZE:
            _cache.popitem(last=False)
        return kernel


def sinc_resample(waveform: torch.Tensor, orig_rate: int, new_rate: int) -> torch.Tensor:
    """The official prompt resampler: (..., N) float -> (..., ceil(N * new / orig)), same device and dtype.

    The same rate returns the input itself (as the official does). Raises InputError for rates whose filter
    bank would exceed `MAX_KERNEL_TAPS` (see `prompt_resample`, which falls back to soxr for them).
    """
    import torch

    if not waveform.is_floating_point():
        raise InputError(f"resampling needs float samples, got {waveform.dtype}: convert the audio to float")
    orig, new = reduced_rates(orig_rate, new_rate)
    if orig == new:
        return waveform
    if kernel_taps(orig, new) > MAX_KERNEL_TAPS:
        raise InputError(
            f"resampling {orig_rate} -> {new_rate} Hz needs a {kernel_taps(orig, new)}-tap filter bank: "
            "convert the audio to a common rate (16000, 22050, 24000, 44100 or 48000 Hz)"
        )
    compute_dtype = waveform.dtype if waveform.dtype in (torch.float32, torch.float64) else torch.float32
    kernel = _cached_kernel(orig, new, waveform.device, compute_dtype)
    width = (kernel.shape[-1] - orig) // 2
    shape = waveform.shape
    flat = waveform.reshape(math.prod(shape[:-1]), shape[-1]).to(compute_dtype)  # (B, N)
    padded = torch.nn.functional.pad(flat, (width, width + orig))
    blocks = torch.nn.functional.conv1d(padded[:, None], kernel, stride=orig)  # (B, q, N / p + 1)
    out = blocks.transpose(1, 2).reshape(flat.shape[0], -1)
    out = out[:, : -(-new * shape[-1] // orig)]
    return out.reshape(*shape[:-1], out.shape[-1]).to(waveform.dtype)


def prompt_resample(samples: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """Prompt audio (N,) float32 -> (ceil(N * to / from),) float32 with the official resampler.

    Rate pairs too odd for the official filter bank (see `MAX_KERNEL_TAPS`) use soxr instead.
    """
    import torch

    samples = np.asarray(samples, dtype=np.float32)
    if from_rate == to_rate:
        return samples.copy()
    if kernel_taps(from_rate, to_rate) > MAX_KERNEL_TAPS:
        return output_resample(samples, from_rate, to_rate)
    with torch.inference_mode():
        out = sinc_resample(torch.from_numpy(np.ascontiguousarray(samples)), from_rate, to_rate)
    return out.numpy()


def output_resample_stream(from_rate: int, to_rate: int) -> soxr.ResampleStream:
    """A streaming resampler for generated audio (chunk by chunk, filter state kept between them)."""
    return soxr.ResampleStream(from_rate, to_rate, 1, dtype="float32", quality=OUTPUT_SOXR_QUALITY)


def output_resample(samples: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """Generated audio (N,) float32 -> (round(N * to / from),) float32 with soxr's high-quality filter."""
    samples = np.asarray(samples, dtype=np.float32)
    if from_rate == to_rate:
        return samples.copy()
    return soxr.resample(samples, from_rate, to_rate, quality=OUTPUT_SOXR_QUALITY).astype(
        np.float32, copy=False
    )
