"""The GPU path, checked on the CPU (issue 21): what reaches the device, in which precision, and what
the host reads back.

- no device values read by a flow pass (meta tensors: reading one raises, like a sync would cost);
- reduced precision: the DiT's products cast once, rotary/noise/time grid/solver state float32
  (a CPU bfloat16 placement runs the same code as CUDA float16);
- the float32 vocoder without TF32, the flags restored afterwards;
- what the engine reports about itself.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from cosyserve.engine.device import Placement, float32_exact
from cosyserve.engine.flow_batching import batched_flow_mels
from cosyserve.engine.flow_stream import FlowPrompt, continue_flow
from cosyserve.engine.loading import load_hift
from cosyserve.engine.pipeline import SegmentInput, SpeechEngine
from cosyserve.engine.token2wav import Token2Wav
from cosyserve.model.flow import CausalFlow
from cosyserve.modeldir.model_dir import ModelDir

CPU_BF16 = Placement(torch.device("cpu"), torch.bfloat16)


@pytest.fixture(scope="module")
def prompt(tiny_dir: Path) -> FlowPrompt:
    with np.load(tiny_dir / "flow.npz") as golden:
        return FlowPrompt(
            torch.from_numpy(golden["prompt_token"]).long()[None],
            torch.from_numpy(golden["prompt_feat"]).float()[None],
            torch.from_numpy(golden["embedding"]).float()[None],
        )


@pytest.fixture(scope="module")
def tokens(tiny_dir: Path) -> torch.Tensor:
    with np.load(tiny_dir / "flow.npz") as golden:
        return torch.from_numpy(golden["token"]).long()[None]


def test_flow_passes_read_no_device_values(
    flow: CausalFlow, prompt: FlowPrompt, tokens: torch.Tensor
) -> None:
    """Item 8: on a device, reading a value (`bool(t.all())`, `int(ids.max())`) makes the host wait for
    the GPU. Meta tensors have no values, so a pass that reads one raises here."""
    meta = copy.deepcopy(flow).to("meta")
    feat, embedding = prompt.speech_feat.to("meta"), prompt.embedding.to("meta")
    for streaming in (False, True):
        mel = meta.inference(tokens.to("meta"), prompt.speech_token.to("meta"), feat, embedding, streaming)
        assert mel.device.type == "meta" and mel.shape[2] == tokens.shape[1] * 2
    # Streaming with kept work: ids on the host (as the engine keeps them), features on the device.
    _, prefix = continue_flow(meta, tokens[:, :40], prompt.speech_token, feat, embedding)
    mel, _ = continue_flow(meta, tokens[:, :60], prompt.speech_token, feat, embedding, prefix)
    assert prefix.frames > 0 and mel.device.type == "meta"
    # A padded batch (its mask is applied as given on a device: no check for "no padding").
    placed = FlowPrompt(prompt.speech_token, feat, embedding)
    mels = batched_flow_mels(meta, [(tokens[:, :30], placed), (tokens, placed)])
    assert [m.shape[2] for m in mels] == [60, tokens.shape[1] * 2]


@pytest.fixture(scope="module")
def bf16_engine(model_dir: ModelDir) -> SpeechEngine:
    return SpeechEngine.load(model_dir, CPU_BF16)


def test_reduced_precision_casts_the_dit_products_once(bf16_engine: SpeechEngine) -> None:
    """Item 7: the DiT's linears and convolutions hold half-precision weights (autocast would re-cast
    float32 ones at every call); everything that must stay float32 does."""
    flow = bf16_engine.token2wav.flow
    dit = flow.decoder.estimator
    products = [m for m in dit.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv1d))]
    assert products and all(m.weight.dtype == torch.bfloat16 for m in products)
    assert dit.rotary_embed.inv_freq.dtype == torch.float32
    assert flow.start_noise.dtype == torch.float32
    assert flow.spk_embed_affine_layer.weight.dtype == torch.float32
    assert flow.input_embedding.weight.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in bf16_engine.token2wav.hift.parameters())
    assert bf16_engine.dtypes()["flow_dit_products"] == "bfloat16"


def test_reduced_precision_keeps_time_and_solver_state_float32(
    bf16_engine: SpeechEngine, prompt: FlowPrompt, tokens: torch.Tensor, monkeypatch, flow: CausalFlow
) -> None:
    t2w = bf16_engine.token2wav
    seen: list[tuple[torch.dtype, torch.dtype]] = []
    estimate = t2w.flow.decoder.estimate

    def spy(x, mask, mu, t, *args):
        seen.append((x.dtype, t.dtype))
        return estimate(x, mask, mu, t, *args)

    monkeypatch.setattr(t2w.flow.decoder, "estimate", spy)
    with t2w._autocast():
        mel = t2w.flow.inference(tokens, prompt.speech_token, prompt.speech_feat, prompt.embedding)
    assert len(seen) == 10 and all(dtypes == (torch.float32, torch.float32) for dtypes in seen)
    exact = flow.inference(tokens, prompt.speech_token, prompt.speech_feat, prompt.embedding)
    # bfloat16 DiT products (8 mantissa bits) through 10 steps against float32: measured mean 0.0024, max
    # 0.015 |d mel| on AVX-512 and AVX2 alike (ATEN_CPU_CAPABILITY=avx2 ...); bounds at ~4x.
    d_mel = (mel - exact).abs()
    assert torch.isfinite(mel).all() and float(d_mel.mean()) < 0.01 and float(d_mel.max()) < 0.06


def test_reduced_precision_engine_speaks(
    bf16_engine: SpeechEngine, prompt: FlowPrompt, tiny_dir: Path
) -> None:
    with np.load(tiny_dir / "llm.npz") as llm:
        segment = SegmentInput(llm["text"][:3].tolist(), llm["prompt_text"].tolist(), [], prompt)
    for stream in (False, True):
        audio = list(bf16_engine.generate(segment, generator=torch.Generator().manual_seed(1), stream=stream))
        assert audio and all(np.isfinite(a).all() for a in audio)


def _tf32_flags() -> tuple[bool, bool]:
    return torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32


@pytest.fixture
def tf32_on():
    """TF32 allowed for convolutions and matrix products (cuDNN's default), restored afterwards."""
    saved = _tf32_flags()
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_the_vocoder_runs_without_tf32_and_restores_the_flags(
    flow: CausalFlow, model_dir: ModelDir, prompt: FlowPrompt, tokens: torch.Tensor, monkeypatch, tf32_on
) -> None:
    """Item 6: cuDNN allows TF32 by default; the float32 vocoder must not use it, and the flags must be
    as before afterwards (one-shot and both streaming paths)."""
    hift = load_hift(model_dir)
    seen: list[tuple[bool, bool]] = []
    decode = hift.decode
    monkeypatch.setattr(hift, "decode", lambda *a, **k: (seen.append(_tf32_flags()), decode(*a, **k))[1])
    placement = Placement(torch.device("cuda"))  # the modules stay on the CPU: only the policy is CUDA's
    for reuse in (True, False):
        t2w = Token2Wav(flow, hift, placement, reuse=reuse)
        t2w.synthesize(tokens, prompt)
        t2w.stream(tokens, prompt)
    assert seen and all(flags == (False, False) for flags in seen), seen
    assert _tf32_flags() == (True, True)


def test_float32_exact_nests_across_threads(tf32_on) -> None:
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with float32_exact():
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(10)
    with float32_exact():
        assert not torch.backends.cudnn.allow_tf32
    assert not torch.backends.cudnn.allow_tf32  # the other thread is still inside
    leave.set()
    thread.join(10)
    assert torch.backends.cudnn.allow_tf32


def test_the_engine_describes_its_dtypes(bf16_engine: SpeechEngine, model_dir: ModelDir) -> None:
    """Item 10: what /ready can report."""
    described = bf16_engine.describe()
    assert described["precision"] == "bfloat16" and described["device"] == "cpu"
    assert described["dtypes"]["lm_weights"] == "bfloat16"
    assert described["dtypes"]["flow_rotary_inv_freq"] == "float32"
    plain = SpeechEngine.load(model_dir, Placement(torch.device("cpu"))).describe()
    assert set(plain["dtypes"].values()) <= {"float32", "float64", "n/a"}
    assert not plain["cuda_graph"] and not plain["batch_decode"] and plain["flow_steps"] == 10


@torch.inference_mode()
def test_lm_steps_read_no_device_values(model_dir: ModelDir) -> None:
    """Item 8: prefill, a decode step and the static (graph) step on meta tensors: no value is read."""
    from cosyserve.engine.cuda_graph import StaticDecodeStep
    from cosyserve.engine.kv_cache import KVCache
    from cosyserve.engine.loading import load_speech_lm
    from cosyserve.engine.speech_lm_runner import decode_one, prefill

    model = load_speech_lm(model_dir).to("meta")
    embeds = model.embed_speech(torch.zeros(1, 10, dtype=torch.long, device="meta"))
    cache = KVCache.allocate(model.config.qwen2, 64, device="meta")
    prefill(model, embeds, cache)
    assert decode_one(model, torch.zeros(1, dtype=torch.long, device="meta"), cache).device.type == "meta"
    step = StaticDecodeStep(model, 64, capture=False)
    prefill(model, embeds, step.reset())
    assert step(5).device.type == "meta"
