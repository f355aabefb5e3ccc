"""The real CosyVoice3 architecture with random weights, built in memory in a second or two.

Used by `cosyserve bench --model full-random` to measure speed and memory without a download, and
(at `scale="tiny"`) by the tests. The numbers in `full_size_config` are those of
`Fun-CosyVoice3-0.5B-2512` (its `cosyvoice3.yaml` and `CosyVoice-BlankEN/config.json`), written out
here so the bench needs no files.

Building is fast because no default initialisation runs: the modules are constructed with the
in-place random fills of `torch.nn.init` turned into no-ops (buffers such as rotary tables are still
computed normally), and every parameter is then filled from one small seeded pool of normal values,
scaled by `1/sqrt(fan_in)` so activations stay in a realistic range through all layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from cosyserve.model.config import (
    CFMConfig,
    CosyVoice3Config,
    DiTConfig,
    F0PredictorConfig,
    FlowConfig,
    HiFTConfig,
    LLMConfig,
    PreLookaheadConfig,
    Qwen2Config,
    SamplingConfig,
)
from cosyserve.model.flow import CausalFlow
from cosyserve.model.hift import HiFTVocoder
from cosyserve.model.speech_lm import SpeechLM

SCALES = ("full", "tiny")
_POOL_SIZE = (1 << 22) + 15  # values in the fill pool; odd so long tensors do not repeat row-aligned
_BIAS_STD = 0.02


def full_size_config() -> CosyVoice3Config:
    """The architecture of Fun-CosyVoice3-0.5B (Qwen2 896 x 24, DiT 1024 x 22, HiFT 512)."""
    qwen2 = Qwen2Config(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        max_position_embeddings=32768,
    )
    llm = LLMConfig(
        llm_input_size=896,
        llm_output_size=896,
        speech_token_size=6561,
        qwen2=qwen2,
        sampling=SamplingConfig(),
    )
    flow = FlowConfig(
        input_size=80,
        output_size=80,
        spk_embed_dim=192,
        vocab_size=6561,
        input_frame_rate=25,
        token_mel_ratio=2,
        pre_lookahead_len=3,
        pre_lookahead=PreLookaheadConfig(in_channels=80, channels=1024, pre_lookahead_len=3),
        cfm=CFMConfig(
            in_channels=240,
            spk_emb_dim=80,
            sigma_min=1e-6,
            solver="euler",
            t_scheduler="cosine",
            inference_cfg_rate=0.7,
        ),
        dit=DiTConfig(
            dim=1024,
            depth=22,
            heads=16,
            dim_head=64,
            ff_mult=2,
            mel_dim=80,
            mu_dim=80,
            spk_dim=80,
            out_channels=80,
            static_chunk_size=50,
            num_decoding_left_chunks=-1,
        ),
    )
    hift = HiFTConfig(
        in_channels=80,
        base_channels=512,
        nb_harmonics=8,
        sampling_rate=24000,
        nsf_alpha=0.1,
        nsf_sigma=0.003,
        nsf_voiced_threshold=10.0,
        upsample_rates=(8, 5, 3),
        upsample_kernel_sizes=(16, 11, 7),
        istft_n_fft=16,
        istft_hop_len=4,
        resblock_kernel_sizes=(3, 7, 11),
        resblock_dilation_sizes=((1, 3, 5),) * 3,
        source_resblock_kernel_sizes=(7, 7, 11),
        source_resblock_dilation_sizes=((1, 3, 5),) * 3,
        lrelu_slope=0.1,
        audio_limit=0.99,
        conv_pre_look_right=4,
        f0_predictor=F0PredictorConfig(num_class=1, in_channels=80, cond_channels=512),
    )
    rates = {"sample_rate": 24000, "token_frame_rate": 25, "token_mel_ratio": 2, "chunk_size": 25}
    return CosyVoice3Config(**rates, llm=llm, flow=flow, hift=hift)


def tiny_config() -> CosyVoice3Config:
    """The same layout shrunk to the parity fixture's sizes (LLM 32 x 2, DiT 64 x 2, HiFT 32): for tests."""
    full = full_size_config()
    qwen2 = replace(
        full.llm.qwen2, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    llm = replace(full.llm, llm_input_size=32, llm_output_size=32, qwen2=qwen2)
    flow = replace(
        full.flow,
        pre_lookahead=replace(full.flow.pre_lookahead, channels=64),
        dit=replace(full.flow.dit, dim=64, depth=2, heads=4, dim_head=16),
    )
    hift = replace(
        full.hift, base_channels=32, f0_predictor=replace(full.hift.f0_predictor, cond_channels=32)
    )
    return replace(full, llm=llm, flow=flow, hift=hift)


def config_for_scale(scale: str) -> CosyVoice3Config:
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}: use one of {', '.join(SCALES)}")
    return full_size_config() if scale == "full" else tiny_config()


@dataclass
class RandomModels:
    """The three networks, float32, eval mode, no gradients."""

    config: CosyVoice3Config
    llm: SpeechLM
    flow: CausalFlow
    hift: HiFTVocoder

    def weight_bytes(self) -> int:
        """Bytes of every parameter and buffer (what a checkpoint-loaded engine would hold)."""
        return sum(module_bytes(m) for m in (self.llm, self.flow, self.hift))


def module_bytes(module: nn.Module) -> int:
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


class _NoRandomInit(TorchFunctionMode):
    """Skips every `torch.nn.init` call (what `reset_parameters` uses), so parameters stay uninitialised."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else None
        return func(*args, **(kwargs or {}))


def _fill_parameters(module: nn.Module, generator: torch.Generator) -> None:
    """Fill every parameter from a shared pool of N(0, 1) values, at a random offset, scaled.

    Weights (>= 2 dims): std 1/sqrt(fan_in). Biases: std 0.02. Other vectors (norm weights, Snake
    alphas): 1 + 0.02 N(0, 1), i.e. near their usual value of one.
    """
    pool = torch.randn(_POOL_SIZE, generator=generator)
    with torch.no_grad():
        for name, param in module.named_parameters():
            flat = param.view(-1)
            if param.dim() >= 2:
                scale, shift = 1.0 / math.sqrt(param[0].numel()), 0.0
            elif name.endswith("bias"):
                scale, shift = _BIAS_STD, 0.0
            else:
                scale, shift = _BIAS_STD, 1.0
            offset = int(torch.randint(_POOL_SIZE, (1,), generator=generator))
            done = 0
            while done < flat.numel():
                take = min(flat.numel() - done, _POOL_SIZE - offset)
                torch.mul(pool[offset : offset + take], scale, out=flat[done : done + take])
                done, offset = done + take, 0
            if shift:
                flat.add_(shift)


def _build(factory, generator: torch.Generator) -> nn.Module:  # type: ignore[no-untyped-def]
    with _NoRandomInit():
        module = factory()
    _fill_parameters(module, generator)
    return module.eval().requires_grad_(False)


def build_random_models(scale: str = "full", seed: int = 0) -> RandomModels:
    """The three networks of `config_for_scale(scale)` with seeded random weights, on the CPU.

    The speech LM holds no text LM head (as when loaded from `llm.pt`).
    """
    config = config_for_scale(scale)
    generator = torch.Generator().manual_seed(seed)
    llm = _build(lambda: SpeechLM(config.llm), generator)
    flow = _build(lambda: CausalFlow(config.flow), generator)
    hift = _build(lambda: HiFTVocoder(config.hift), generator)
    return RandomModels(config, llm, flow, hift)  # type: ignore[arg-type]
