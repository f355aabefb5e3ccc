"""Parity of tokens → waveform with `token2wav.npz`: one-shot, and the streaming schedule chunk by chunk.

The prompt inputs are those of `flow.npz`; the vocoder's noise buffers are those of `hift.npz`
(the official fixed noise), injected so the waveforms compare sample by sample.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from cosyserve.engine.loading import load_flow, load_hift
from cosyserve.engine.token2wav import FlowPrompt, Token2Wav
from cosyserve.errors import CosyServeError
from cosyserve.model.hift import SourceNoise
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity import CheckResult, compare

WAVEFORM_TOLERANCE = 1e-4


def fixture_prompt(fixture_dir: Path) -> FlowPrompt:
    with np.load(fixture_dir / "flow.npz") as flow:
        return FlowPrompt(
            speech_token=torch.from_numpy(flow["prompt_token"]).long()[None],
            speech_feat=torch.from_numpy(flow["prompt_feat"]).float()[None],
            embedding=torch.from_numpy(flow["embedding"]).float()[None],
        )


def fixture_noise(fixture_dir: Path) -> SourceNoise:
    with np.load(fixture_dir / "hift.npz") as hift:
        return SourceNoise(
            rand_ini=torch.from_numpy(hift["rand_ini"]),
            sine_noise=torch.from_numpy(hift["sine_noise"]),
            uv_noise=torch.from_numpy(hift["uv_noise"]),
        )


def run(model_dir: ModelDir, fixture_dir: Path) -> list[CheckResult]:
    """Compare `wav_nonstream`, each streamed chunk's length and the streamed waveform."""
    for needed in ("flow.npz", "hift.npz"):
        if not (fixture_dir / needed).is_file():
            raise CosyServeError(f"token2wav check needs {needed} (prompt inputs / noise) in {fixture_dir}")
    runner = Token2Wav(load_flow(model_dir), load_hift(model_dir), source_noise=fixture_noise(fixture_dir))
    prompt = fixture_prompt(fixture_dir)
    with np.load(fixture_dir / "token2wav.npz") as data:
        golden = {key: data[key] for key in data.files}
    tokens = torch.from_numpy(golden["token"]).long()[None]

    results = [
        compare(
            "token2wav wav_nonstream",
            runner.synthesize(tokens, prompt).numpy(),
            golden["wav_nonstream"],
            WAVEFORM_TOLERANCE,
        )
    ]
    chunks = runner.stream(tokens, prompt)
    lengths = np.array([chunk.shape[0] for chunk in chunks])
    expected_lengths = golden["stream_chunk_lens"]
    same = lengths.shape == expected_lengths.shape and bool((lengths == expected_lengths).all())
    results.append(
        CheckResult(
            "token2wav stream_chunk_lens",
            0.0 if same else float("inf"),
            0.0,
            "" if same else f"{lengths.tolist()} != {expected_lengths.tolist()}",
        )
    )
    results.append(
        compare("token2wav wav_stream", torch.cat(chunks).numpy(), golden["wav_stream"], WAVEFORM_TOLERANCE)
    )
    return results
