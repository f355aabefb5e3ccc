"""What the take checks (`service.quality`) add to one synthesis: the scorer timed on audio as long as the
bench's output. The bench's networks come without the model directory's ONNX files, so the speaker
encoder is the demo's stand-in graph; the real CAM++ adds its own run (tens of ms per 10 s on a CPU)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch

TEXT = "今天天气很好，我们一起去公园散步，看看湖边的花开了没有。"


def scoring_seconds(audio_seconds: float, sample_rate: int, speech_tokens: int, repeats: int = 2) -> float:
    """Best of `repeats` times to score a take of `audio_seconds` with `speech_tokens` LM tokens."""
    from cosyserve.frontend.onnx_models import SpeakerEncoder
    from cosyserve.frontend.standin_onnx import write_campplus_standin
    from cosyserve.service.quality.scorer import TakeInput, TakeScorer

    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal(max(1, round(audio_seconds * sample_rate)))).astype(np.float32)
    tokens = rng.integers(0, 6561, speech_tokens).tolist()
    with tempfile.TemporaryDirectory() as folder:
        encoder = SpeakerEncoder(write_campplus_standin(Path(folder) / "campplus.onnx"), device="cpu")
        scorer = TakeScorer(encoder)
        take = TakeInput(audio, sample_rate, TEXT, [tokens], torch.ones(1, 192), voice_seconds_per_unit=0.2)
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            scorer.score(take)
            best = min(best, time.perf_counter() - started)
    return best
