"""HiFT vocoder: parity with the official outputs, fixed noise, checkpoint layouts, full-size shape."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from cosyserve.errors import InputError
from cosyserve.model.checkpoint import read_state_dict
from cosyserve.model.hift import HiFTVocoder, SourceNoise, make_source_noise
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity import hift as hift_parity

# Parameters of the 0.5B model's vocoder with weight norm folded into plain weights; the checkpoint
# stores 14,290 more (one weight-norm gain per output channel of each normalised conv).
FULL_SIZE_PARAMETERS = 20_765_597


@pytest.fixture(scope="module")
def vocoder(model_dir: ModelDir) -> HiFTVocoder:
    return HiFTVocoder.from_state_dict(model_dir.config.hift, read_state_dict(model_dir.path / "hift.pt"))


@pytest.fixture(scope="module")
def golden(tiny_dir: Path) -> dict[str, np.ndarray]:
    return dict(np.load(tiny_dir / "hift.npz"))


def _fixture_noise(golden: dict[str, np.ndarray]) -> SourceNoise:
    return SourceNoise(*(torch.from_numpy(golden[key]) for key in ("rand_ini", "sine_noise", "uv_noise")))


def test_parity_with_official_outputs(model_dir: ModelDir, tiny_dir: Path) -> None:
    results = hift_parity.run(model_dir, tiny_dir)
    names = {result.name for result in results}
    assert {"hift f0", "hift wav_final", "hift wav_nonfinal"} <= names
    for result in results:
        assert result.passed, f"{result.name}: max abs diff {result.max_abs_diff} {result.detail}"


def test_fixed_noise_is_deterministic(vocoder: HiFTVocoder, model_dir: ModelDir, golden) -> None:
    mel = torch.from_numpy(golden["mel"])[None]
    first, _ = vocoder.inference(mel, finalize=True)
    second, _ = vocoder.inference(mel, finalize=True)
    assert torch.equal(first, second)
    # Another instance (another process, in effect) draws the same noise from the same seed.
    other = HiFTVocoder.from_state_dict(model_dir.config.hift, read_state_dict(model_dir.path / "hift.pt"))
    assert torch.equal(other.inference(mel, finalize=True)[0], first)


def test_noise_for_a_sample_does_not_depend_on_buffer_length() -> None:
    short, long = make_source_noise(8, 1000, seed=3), make_source_noise(8, 300_000, seed=3)
    assert short.sine_noise.shape == (1000, 9) and short.uv_noise.shape == (1000, 1)
    assert torch.equal(long.sine_noise[:1000], short.sine_noise)
    assert torch.equal(long.rand_ini, short.rand_ini) and short.rand_ini[0, 0] == 0
    assert not torch.equal(make_source_noise(8, 1000, seed=4).sine_noise, short.sine_noise)


def test_only_sine_noise_reaches_the_waveform(vocoder: HiFTVocoder, golden) -> None:
    mel = torch.from_numpy(golden["mel"])[None]
    noise = _fixture_noise(golden)
    altered = dataclasses.replace(
        noise, rand_ini=torch.rand_like(noise.rand_ini), uv_noise=noise.uv_noise * 0
    )
    assert torch.equal(vocoder.inference(mel, True, noise)[0], vocoder.inference(mel, True, altered)[0])


def test_non_final_output_is_a_prefix_of_the_final_output(vocoder: HiFTVocoder, golden) -> None:
    mel = torch.from_numpy(golden["mel"])[None]
    final, _ = vocoder.inference(mel, finalize=True)
    for frames in (vocoder.look_ahead_frames, 30, mel.shape[2] - 1):
        partial, _ = vocoder.inference(mel[:, :, :frames], finalize=False)
        assert partial.shape[1] == vocoder.num_output_samples(frames, finalize=False)
        torch.testing.assert_close(partial, final[:, : partial.shape[1]], rtol=0, atol=1e-6)


def test_legacy_weight_norm_layout_loads(vocoder: HiFTVocoder, model_dir: ModelDir, golden) -> None:
    legacy = {}
    for key, value in read_state_dict(model_dir.path / "hift.pt").items():
        key = key.replace(".parametrizations.weight.original0", ".weight_g")
        legacy[key.replace(".parametrizations.weight.original1", ".weight_v")] = value
    assert any(key.endswith(".weight_g") for key in legacy)
    loaded = HiFTVocoder.from_state_dict(model_dir.config.hift, legacy)
    mel = torch.from_numpy(golden["mel"])[None]
    assert torch.equal(loaded.inference(mel, True)[0], vocoder.inference(mel, True)[0])


def test_full_size_parameter_count(model_dir: ModelDir) -> None:
    tiny = model_dir.config.hift
    full = dataclasses.replace(
        tiny, base_channels=512, f0_predictor=dataclasses.replace(tiny.f0_predictor, cond_channels=512)
    )
    with torch.device("meta"):
        vocoder = HiFTVocoder(full)
    assert sum(p.numel() for p in vocoder.parameters()) == FULL_SIZE_PARAMETERS


def test_bad_inputs_raise_input_error(vocoder: HiFTVocoder, golden) -> None:
    mel = torch.from_numpy(golden["mel"])[None]
    with pytest.raises(InputError, match="frames"):
        vocoder.inference(mel[:, :, : vocoder.look_ahead_frames - 1], finalize=False)
    with pytest.raises(InputError, match="shape"):
        vocoder.inference(mel[0], finalize=True)
    short = make_source_noise(8, 100)
    with pytest.raises(InputError, match="noise"):
        vocoder.inference(mel, finalize=True, noise=short)
