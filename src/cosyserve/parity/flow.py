"""Parity of the flow model against `flow.npz`: four mels (streaming x finalize) and the fixed noise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from cosyserve.engine.loading import load_flow
from cosyserve.model.flow import fixed_start_noise
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity import CheckResult, compare

MEL_TOLERANCE = 1e-3
NOISE_TOLERANCE = 1e-6
CASES = tuple((streaming, finalize) for streaming in (False, True) for finalize in (False, True))


def run(model_dir: ModelDir, fixture_dir: Path) -> list[CheckResult]:
    """Compare every `mel_stream{s}_final{f}` case and `rand_noise_head` of `fixture_dir/flow.npz`."""
    flow = load_flow(model_dir)
    with np.load(fixture_dir / "flow.npz") as data:
        golden = {key: data[key] for key in data.files}
    token = torch.from_numpy(golden["token"]).long()[None]
    prompt_token = torch.from_numpy(golden["prompt_token"]).long()[None]
    prompt_feat = torch.from_numpy(golden["prompt_feat"]).float()[None]
    embedding = torch.from_numpy(golden["embedding"]).float()[None]

    results = []
    for streaming, finalize in CASES:
        key = f"mel_stream{int(streaming)}_final{int(finalize)}"
        mel = flow.inference(
            token, prompt_token, prompt_feat, embedding, streaming=streaming, finalize=finalize
        )
        results.append(compare(f"flow {key}", mel[0].numpy(), golden[key], MEL_TOLERANCE))

    head = golden["rand_noise_head"]
    noise = fixed_start_noise(head.shape[0])[0, :, : head.shape[1]].numpy()
    results.append(compare("flow rand_noise_head", noise, head, NOISE_TOLERANCE))
    return results
