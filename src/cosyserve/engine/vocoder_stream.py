"""One stream's incremental vocoding: each call runs the vocoder on the new mel frames plus the
context `cosyserve.model.hift_stream` says it needs, and returns exactly the samples that vocoding the
whole mel so far would add. The state (`VocoderStream`) is per request, never shared.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cosyserve.errors import InputError
from cosyserve.model.hift import HiFTVocoder, SourceNoise
from cosyserve.model.hift_stream import F0_CONTEXT_FRAMES, decoder_context_frames


@dataclass
class VocoderStream:
    """One stream's vocoding progress (mutable, never shared). All frame counts are absolute."""

    frames: int = 0  # mel frames received
    mel: torch.Tensor | None = None  # (1, 80, frames - mel_start): the frames later calls still read
    mel_start: int = 0
    f0_frames: int = 0  # frames whose F0 and source are final (their look-ahead had arrived)
    source: torch.Tensor | None = None  # (1, 1, (f0_frames - source_start) * hop)
    source_start: int = 0
    cycles: torch.Tensor | None = None  # (1, nb_harmonics + 1) float64 phase running total at f0_frames
    emitted_frames: int = 0  # frames whose samples have been returned
    finished: bool = False


@torch.inference_mode()
def vocode_increment(
    hift: HiFTVocoder,
    state: VocoderStream,
    new_mel: torch.Tensor,
    finalize: bool,
    noise: SourceNoise | None = None,
) -> torch.Tensor:
    """Append new_mel (1, 80, T) to the stream and return the new samples (1, S) float32: exactly the
    samples that `hift.inference(all mel so far, finalize)` has beyond those already returned."""
    if state.finished:
        raise InputError("this vocoder stream has already been finished")
    if new_mel.dim() != 3 or new_mel.shape[:2] != (1, hift.config.in_channels):
        raise InputError(
            f"stream mel must have shape (1, {hift.config.in_channels}, frames), got {tuple(new_mel.shape)}"
        )
    if not finalize and state.frames + new_mel.shape[2] < hift.look_ahead_frames:
        raise InputError(
            f"the vocoder needs at least {hift.look_ahead_frames} mel frames with finalize=False, "
            f"got {state.frames + new_mel.shape[2]}; wait for more frames or finalize"
        )
    state.mel = new_mel if state.mel is None else torch.cat((state.mel, new_mel.to(state.mel)), dim=2)
    state.frames += new_mel.shape[2]
    f0_end = state.frames if finalize else state.frames - hift.f0_predictor.look_ahead
    _extend_source(hift, state, f0_end, finalize, noise)

    first = state.emitted_frames
    last = f0_end if finalize else f0_end - hift.config.conv_pre_look_right - 1
    if last <= first:  # too few new frames for a new sample
        state.finished = finalize
        _forget_old(hift, state)
        return new_mel.new_zeros(1, 0, dtype=torch.float32)
    window = max(0, first - decoder_context_frames(hift.config))
    mel = _mel_between(state, window, f0_end)
    source = state.source[:, :, (window - state.source_start) * hift.hop_length :]
    wav = hift.decode(mel, source, finalize)[:, (first - window) * hift.hop_length :]
    state.emitted_frames = first + wav.shape[1] // hift.hop_length
    state.finished = finalize
    _forget_old(hift, state)
    return wav


def _extend_source(
    hift: HiFTVocoder, state: VocoderStream, f0_end: int, finalize: bool, noise: SourceNoise | None
) -> None:
    """F0 and source for frames f0_frames .. f0_end - 1, from a window with the F0 predictor's context."""
    start = state.f0_frames
    if f0_end <= start:
        return
    window = max(0, start - F0_CONTEXT_FRAMES)
    f0 = hift.predict_f0(_mel_between(state, window, state.frames), finalize)[:, start - window :]
    hop = hift.hop_length
    if noise is None:
        noise = hift.fixed_noise(f0_end * hop, f0.device)
    elif noise.num_samples < f0_end * hop:
        raise InputError(
            f"injected source noise has {noise.num_samples} samples; this stream needs {f0_end * hop} "
            f"for {f0_end} frames"
        )
    sine_noise = noise.sine_noise[start * hop : f0_end * hop].to(f0.device)
    source, state.cycles = hift.m_source.excite(f0, sine_noise, state.cycles)
    state.source = source if state.source is None else torch.cat((state.source, source), dim=2)
    state.f0_frames = f0_end


def _mel_between(state: VocoderStream, start: int, end: int) -> torch.Tensor:
    """Frames start .. end - 1 of the stream's mel (1, 80, end - start)."""
    if state.mel is None or start < state.mel_start:
        raise RuntimeError(f"mel frame {start} is no longer kept (kept from {state.mel_start})")
    return state.mel[:, :, start - state.mel_start : end - state.mel_start]


def _forget_old(hift: HiFTVocoder, state: VocoderStream) -> None:
    """Drop mel and source that no later call reads."""
    if state.finished:
        state.mel = state.source = None
        return
    decoder_from = max(0, state.emitted_frames - decoder_context_frames(hift.config))
    mel_from = min(decoder_from, max(0, state.f0_frames - F0_CONTEXT_FRAMES))
    if mel_from > state.mel_start:
        state.mel = state.mel[:, :, mel_from - state.mel_start :]
        state.mel_start = mel_from
    if decoder_from > state.source_start:
        state.source = state.source[:, :, (decoder_from - state.source_start) * hift.hop_length :]
        state.source_start = decoder_from
