"""A prompt recording -> the three conditioning inputs of zero-shot cloning, aligned as the model expects.

validate -> trim silence -> normalise loudness -> resample to 16 and 24 kHz -> features -> ONNX models ->
cut the prompt mel and the prompt tokens to a common length: mel frames (50 Hz) = 2 x tokens (25 Hz).

The official front end only loads, averages the channels and resamples the file (once per target rate,
always from the file's own rate) with the resampler that `prompt_resample` reproduces. Trimming and
loudness normalisation are cosyserve's additions (see `audio`); they run at the file's rate before the
resampling, which is equivalent to running them after it: the gain is linear, and the trimmed edges keep
silence margins far wider than the filter's reach (tests/test_prompt_resampling.py checks both on the
official resampling fixtures).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from cosyserve.frontend.audio import normalise_loudness, trim_silence
from cosyserve.frontend.features import FLOW_MEL_24K, fbank80, mel24k, whisper_logmel128
from cosyserve.frontend.onnx_models import SpeakerEncoder, SpeechTokenizer
from cosyserve.frontend.prompt_check import MAX_PROMPT_S, PromptReport, load_prompt
from cosyserve.frontend.resampling import prompt_resample

TOKENIZER_SAMPLE_RATE = 16000
MEL_FRAMES_PER_TOKEN = 2  # 50 Hz prompt mel / 25 Hz speech tokens


@dataclass(frozen=True, eq=False)
class PromptFeatures:
    """Everything the LLM and the flow need from a prompt recording (CPU tensors, batch of one)."""

    speech_feat: torch.Tensor  # (1, T, 80) float32 prompt mel, T = 2 * Tt
    speech_feat_len: torch.Tensor  # (1,) int32, = T
    speech_token: torch.Tensor  # (1, Tt) int32 prompt speech tokens in [0, 6561)
    embedding: torch.Tensor  # (1, 192) float32 speaker embedding (not normalised; the flow does that)
    report: PromptReport | None = None  # measurements and warnings, when built from a recording

    @property
    def num_tokens(self) -> int:
        return int(self.speech_token.shape[1])


def align_prompt(speech_feat: torch.Tensor, speech_token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut (1, T, 80) mel and (1, Tt) tokens to the longest common length with T = 2 * Tt."""
    token_len = min(speech_feat.shape[1] // MEL_FRAMES_PER_TOKEN, speech_token.shape[1])
    return speech_feat[:, : MEL_FRAMES_PER_TOKEN * token_len], speech_token[:, :token_len]


def features_from_waveforms(
    wav16k: np.ndarray | torch.Tensor,
    wav24k: np.ndarray | torch.Tensor,
    speaker_encoder: SpeakerEncoder,
    speech_tokenizer: SpeechTokenizer,
    report: PromptReport | None = None,
) -> PromptFeatures:
    """Features of an already prepared prompt: (N16,) at 16 kHz and (N24,) at 24 kHz, same content."""
    speech_feat = mel24k(wav24k).T[None].contiguous()  # (1, T, 80)
    speech_token = speech_tokenizer(whisper_logmel128(wav16k))  # (1, Tt)
    speech_feat, speech_token = align_prompt(speech_feat, speech_token)
    embedding = speaker_encoder(fbank80(wav16k))
    return PromptFeatures(
        speech_feat=speech_feat,
        speech_feat_len=torch.tensor([speech_feat.shape[1]], dtype=torch.int32),
        speech_token=speech_token,
        embedding=embedding,
        report=report,
    )


def prepare_prompt_audio(
    source: str | Path | bytes | BinaryIO, sample_rate: int = FLOW_MEL_24K.sample_rate, denoise: bool = False
) -> tuple[np.ndarray, np.ndarray, PromptReport]:
    """Decode, validate, (optionally denoise,) trim and normalise a prompt; return (wav16k (N16,), wav at
    `sample_rate`, report). The report measures the recording as uploaded."""
    audio, report = load_prompt(source)
    samples = audio.samples
    if denoise:
        from cosyserve.frontend.denoise import denoise as suppress_noise

        samples = suppress_noise(samples, audio.sample_rate)
    wav16k, wav_flow = condition_prompt(samples, audio.sample_rate, sample_rate)
    return wav16k, wav_flow, report


def condition_prompt(
    samples: np.ndarray, source_rate: int, flow_rate: int = FLOW_MEL_24K.sample_rate
) -> tuple[np.ndarray, np.ndarray]:
    """A validated prompt (N,) at `source_rate` -> (wav16k (N16,), wav at `flow_rate` (Nf,)): trimmed,
    loudness-normalised, then resampled from `source_rate` with the official resampler."""
    samples = trim_silence(samples, source_rate, max_duration_s=MAX_PROMPT_S)
    samples = normalise_loudness(samples, source_rate)
    return resample_prompt(samples, source_rate, flow_rate)


def resample_prompt(
    samples: np.ndarray, source_rate: int, flow_rate: int = FLOW_MEL_24K.sample_rate
) -> tuple[np.ndarray, np.ndarray]:
    """(N,) at `source_rate` -> (wav16k, wav at `flow_rate`), each resampled from the source as the official
    `load_wav(wav, 16000)` / `load_wav(wav, 24000)` do."""
    return (
        prompt_resample(samples, source_rate, TOKENIZER_SAMPLE_RATE),
        prompt_resample(samples, source_rate, flow_rate),
    )


def analyse_prompt(
    wav_path_or_bytes: str | Path | bytes | BinaryIO,
    speaker_encoder: SpeakerEncoder,
    speech_tokenizer: SpeechTokenizer,
    sample_rate: int = FLOW_MEL_24K.sample_rate,
    denoise: bool = False,
) -> PromptFeatures:
    """A prompt recording (path, bytes or binary file) -> PromptFeatures; InputError if it is unusable.
    `denoise`: suppress background noise first (`frontend.denoise`)."""
    if sample_rate != FLOW_MEL_24K.sample_rate:
        raise ValueError(
            f"only 24 kHz models are supported (the prompt mel is defined at 24 kHz), got {sample_rate}"
        )
    wav16k, wav24k, report = prepare_prompt_audio(wav_path_or_bytes, sample_rate, denoise)
    return features_from_waveforms(wav16k, wav24k, speaker_encoder, speech_tokenizer, report)
