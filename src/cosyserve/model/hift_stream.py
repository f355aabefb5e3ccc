"""How much context incremental vocoding needs: the engine (`cosyserve.engine.vocoder_stream`) runs
the vocoder on the new mel frames plus this much context, and gets what re-vocoding the whole mel so
far would add (the official streaming does that re-vocoding at every chunk, a cost that grows with
the square of the utterance length).

Why a window gives the same samples:
- F0: the predictor looks `look_ahead` frames ahead and `F0_CONTEXT_FRAMES` back (and computes in
  float64, so its float32 result rarely depends on how the convolutions were blocked).
- source: the harmonic phase is a running sum from the start of the utterance; the running total is
  carried from window to window in float64 exactly as the whole-utterance sum builds it
  (`HarmonicSource.excite`), and the noise is indexed by sample from the start of the utterance.
- decoder: everything is causal except `conv_pre`'s look-ahead, and its reach into the past is under
  `decoder_context_frames(config)` frames, so starting it that many frames before the first new one
  reproduces those samples up to float rounding.
"""

from __future__ import annotations

import math

from cosyserve.model.config import HiFTConfig
from cosyserve.model.f0_predictor import F0_CONV_LAYERS, F0_KERNEL

F0_CONTEXT_FRAMES = (F0_CONV_LAYERS - 1) * (F0_KERNEL - 1)  # the causal convolutions after the first
_CONTEXT_MARGIN_FRAMES = 2
_POST_KERNEL = 7  # HiFTVocoder.conv_post


def _resblock_reach(kernel: int, dilations: tuple[int, ...] | list[int]) -> int:
    """Steps into the past one Snake residual block reads: a dilated and a plain conv per dilation."""
    return sum((kernel - 1) * dilation + (kernel - 1) for dilation in dilations)


def decoder_context_frames(config: HiFTConfig) -> int:
    """Mel frames before its first output frame that the decoder's output can depend on (rounded up,
    plus a margin). An upper bound: every branch's reach is added, although they run side by side."""
    steps_per_frame, reach = 1, 0.0
    for stage, (rate, kernel) in enumerate(
        zip(config.upsample_rates, config.upsample_kernel_sizes, strict=True)
    ):
        steps_per_frame *= rate
        main = max(
            _resblock_reach(k, d)
            for k, d in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes, strict=True)
        )
        source = _resblock_reach(
            config.source_resblock_kernel_sizes[stage], config.source_resblock_dilation_sizes[stage]
        )
        # + 3: the strided source conv spans two steps, the reflect pad or STFT edge one more.
        reach += (kernel - 1 + main + source + 3) / steps_per_frame
    post_kernel = 7
    reach += (post_kernel - 1) / steps_per_frame + config.istft_n_fft / (
        steps_per_frame * config.istft_hop_len
    )
    return math.ceil(reach) + _CONTEXT_MARGIN_FRAMES
