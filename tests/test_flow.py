"""Flow model (speech tokens -> mel) against the official outputs in `parity/tiny/flow.npz`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from cosyserve.errors import InputError
from cosyserve.model.flow import MAX_MEL_FRAMES, CausalFlow, fixed_start_noise
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity import flow as flow_parity

# Parameters of the full-size flow (DiT dim 1024 x 22 layers, 16 heads x 64, ff x2, pre-lookahead 1024).
FULL_SIZE_PARAMETERS = 332_257_088


@pytest.fixture(scope="module")
def inputs(tiny_dir: Path) -> dict[str, torch.Tensor]:
    with np.load(tiny_dir / "flow.npz") as data:
        return {
            "token": torch.from_numpy(data["token"]).long()[None],
            "prompt_token": torch.from_numpy(data["prompt_token"]).long()[None],
            "prompt_feat": torch.from_numpy(data["prompt_feat"]).float()[None],
            "embedding": torch.from_numpy(data["embedding"]).float()[None],
        }


def test_parity_all_cases(model_dir: ModelDir, tiny_dir: Path) -> None:
    results = flow_parity.run(model_dir, tiny_dir)
    names = {r.name for r in results}
    assert names == {f"flow mel_stream{s}_final{f}" for s in (0, 1) for f in (0, 1)} | {
        "flow rand_noise_head"
    }
    for result in results:
        assert result.passed, (
            f"{result.name}: max abs diff {result.max_abs_diff} > {result.tolerance} {result.detail}"
        )


def test_fixed_noise_is_cached_and_leaves_global_rng_alone() -> None:
    state = torch.get_rng_state()
    noise = fixed_start_noise(8)  # a channel count nothing else uses, so it is created here
    assert torch.equal(torch.get_rng_state(), state)
    assert noise.shape == (1, 8, MAX_MEL_FRAMES)
    assert fixed_start_noise(8) is noise


def test_deterministic(flow: CausalFlow, inputs: dict[str, torch.Tensor]) -> None:
    first = flow.inference(**inputs, streaming=True, finalize=False)
    second = flow.inference(**inputs, streaming=True, finalize=False)
    assert torch.equal(first, second)


def test_streaming_prefix_matches_full_utterance(flow: CausalFlow, inputs: dict[str, torch.Tensor]) -> None:
    """With chunked attention, frames in complete chunks do not change when more tokens arrive."""
    full = flow.inference(**inputs, streaming=True, finalize=True)
    prefix_tokens = 40
    partial = flow.inference(
        **{**inputs, "token": inputs["token"][:, :prefix_tokens]}, streaming=True, finalize=False
    )
    chunk = flow.config.dit.static_chunk_size
    n_prompt = inputs["prompt_feat"].shape[1]
    n_frames = flow.mel_frames(inputs["prompt_token"].shape[1] + prefix_tokens, finalize=False)
    stable = n_frames // chunk * chunk - n_prompt
    assert stable > 0
    assert torch.allclose(partial[:, :, :stable], full[:, :, :stable], atol=1e-5)


def test_too_long_request_raises_input_error(flow: CausalFlow, inputs: dict[str, torch.Tensor]) -> None:
    n_tokens = MAX_MEL_FRAMES // flow.token_mel_ratio - inputs["prompt_token"].shape[1] + 1
    token = torch.zeros(1, n_tokens, dtype=torch.long)
    with pytest.raises(InputError, match="exceed the limit of 15000"):
        flow.inference(**{**inputs, "token": token}, finalize=True)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"token": torch.full((1, 5), 6562)}, "outside the 6561 speech codes"),
        ({"token": torch.zeros(2, 5, dtype=torch.long)}, "one utterance per call"),
        ({"embedding": torch.zeros(1, 80)}, "speaker embedding"),
    ],
)
def test_bad_inputs_raise_input_error(
    flow: CausalFlow, inputs: dict[str, torch.Tensor], change: dict[str, torch.Tensor], message: str
) -> None:
    with pytest.raises(InputError, match=message):
        flow.inference(**{**inputs, **change})


def test_full_size_parameter_count(model_dir: ModelDir) -> None:
    tiny = model_dir.config.flow
    full = dataclasses.replace(
        tiny,
        pre_lookahead=dataclasses.replace(tiny.pre_lookahead, channels=1024),
        dit=dataclasses.replace(tiny.dit, dim=1024, depth=22, heads=16, dim_head=64, ff_mult=2),
    )
    with torch.device("meta"):  # shapes only: no memory for 332M weights
        model = CausalFlow(full)
    assert sum(p.numel() for p in model.parameters()) == FULL_SIZE_PARAMETERS
    assert model.state_dict()["decoder.estimator.rotary_embed.inv_freq"].shape == (32,)


@torch.inference_mode()
def test_dit_fast_paths_equal_the_general_ones(flow: CausalFlow) -> None:
    """One shared modulation row, no masks for all-valid frames, a contiguous residual stream: the
    shortcuts the DiT takes in the common case give the general path's values."""
    from cosyserve.model.dit import modulate

    estimator = flow.decoder.estimator
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 7, estimator.config.dim, generator=generator)
    scale, shift = torch.randn(1, estimator.config.dim), torch.randn(1, estimator.config.dim)
    shared = modulate(x, scale, shift)
    per_row = modulate(x, scale.expand(2, -1), shift.expand(2, -1))
    torch.testing.assert_close(shared, per_row, atol=1e-6, rtol=0)

    channels, frames = estimator.config.mel_dim, 40
    args = [torch.randn(2, channels, frames, generator=generator) for _ in range(3)]
    spks = torch.randn(2, estimator.config.spk_dim, generator=generator)
    t = torch.full((2,), 0.4)
    valid = torch.ones(2, 1, frames)
    unmasked = estimator(args[0], valid, args[1], t, spks, args[2])
    # A padded third row takes the masked path; the two valid rows must not change.
    padded = [torch.cat((a, torch.zeros(1, channels, frames))) for a in args]
    mask = torch.cat((valid, torch.zeros(1, 1, frames)))
    mask[2, 0, :10] = 1
    masked = estimator(
        padded[0], mask, padded[1], torch.full((3,), 0.4), torch.cat((spks, spks[:1])), padded[2]
    )
    torch.testing.assert_close(masked[:2], unmasked, atol=1e-5, rtol=0)

    h = estimator.input_embed(*(a.transpose(1, 2) for a in args), spks)
    assert h.is_contiguous()


@torch.inference_mode()
def test_passes_reuse_their_time_conditioning_until_it_would_change(
    model_dir: ModelDir, inputs: dict[str, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `keep_time_conditioning`, the modulation of the solver's times is computed once for every
    pass with the same steps and rows, and again for other rows or steps or a replaced module."""
    from cosyserve.engine.loading import load_flow

    flow = load_flow(model_dir)  # its own copy: this test changes weights
    estimator = flow.decoder.estimator
    calls: list[int] = []
    original = estimator.time_conditioning

    def counted(t: torch.Tensor) -> list[torch.Tensor]:
        calls.append(t.shape[-1])
        return original(t)

    monkeypatch.setattr(estimator, "time_conditioning", counted)

    def mel(**options: object) -> torch.Tensor:
        return flow.inference(**inputs, streaming=False, finalize=True, **options)  # type: ignore[arg-type]

    first = mel()
    assert torch.equal(mel(), first) and len(calls) == 2  # off by default: every pass computes them
    flow.decoder.keep_time_conditioning()
    assert torch.equal(mel(), first) and torch.equal(mel(), first) and len(calls) == 3
    mel(guidance=False)  # one row instead of two
    mel(n_timesteps=5)
    assert calls == [2, 2, 2, 1, 2]
    estimator.norm_out.linear = torch.nn.Linear(*reversed(estimator.norm_out.linear.weight.shape))
    changed = mel()
    assert len(calls) == 6 and not torch.equal(changed, first)  # a replaced module is noticed
    estimator.transformer_blocks[0].attn_norm.linear.bias.add_(1.0)  # in place: not noticed ...
    assert torch.equal(mel(), changed) and len(calls) == 6
    flow.decoder.keep_time_conditioning()  # ... until it is said
    assert not torch.equal(mel(), changed) and len(calls) == 7
