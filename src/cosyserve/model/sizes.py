"""The sizes of the real CosyVoice3 architecture (`Fun-CosyVoice3-0.5B-2512`: its `cosyvoice3.yaml` and
`CosyVoice-BlankEN/config.json`), written out so that benchmarks and the full-size demo model need no
download; and the parity fixture's reduced sizes, for tests.
"""

from __future__ import annotations

from dataclasses import replace

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
