"""The text files of a demo model directory (`demo_model`) in two sizes: `demo`, small networks for
offline tries and tests, and `full`, the real architecture (`model.sizes.full_size_config`) with random
weights, for timing cold starts and memory on the real sizes without a download.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from cosyserve.model.sizes import full_size_config
from cosyserve.modeldir.demo_tokenizer import LLM_SIZES

SIZE_NAMES = ("demo", "full")


@dataclass(frozen=True)
class DemoSizes:
    """The sizes a demo model directory's YAML and Qwen2 `config.json` state."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    dit_dim: int
    dit_depth: int
    dit_heads: int
    dit_dim_head: int
    pre_lookahead_channels: int
    hift_channels: int
    f0_channels: int

    def llm_sizes(self) -> dict[str, int]:
        """The Qwen2 sizes as `demo_tokenizer.tokenizer_files` takes them."""
        keys = ("hidden", "layers", "heads", "kv_heads", "intermediate")
        return {key: value for key, value in asdict(self).items() if key in keys}


DEMO_SIZES = DemoSizes(
    "demo", **LLM_SIZES, dit_dim=64, dit_depth=2, dit_heads=4, dit_dim_head=16,
    pre_lookahead_channels=64, hift_channels=32, f0_channels=32,
)  # fmt: skip


def full_sizes() -> DemoSizes:
    """The real architecture's sizes, from `model.sizes` (never written out twice)."""
    config = full_size_config()
    qwen2, dit = config.llm.qwen2, config.flow.dit
    return DemoSizes(
        "full",
        hidden=qwen2.hidden_size,
        intermediate=qwen2.intermediate_size,
        layers=qwen2.num_hidden_layers,
        heads=qwen2.num_attention_heads,
        kv_heads=qwen2.num_key_value_heads,
        dit_dim=dit.dim,
        dit_depth=dit.depth,
        dit_heads=dit.heads,
        dit_dim_head=dit.dim_head,
        pre_lookahead_channels=config.flow.pre_lookahead.channels,
        hift_channels=config.hift.base_channels,
        f0_channels=config.hift.f0_predictor.cond_channels,
    )


def sizes_named(name: str) -> DemoSizes:
    if name == "full":
        return full_sizes()
    if name == "demo":
        return DEMO_SIZES
    raise ValueError(f"unknown demo model size {name!r}: one of {', '.join(SIZE_NAMES)}")


def yaml_text(sizes: DemoSizes) -> str:
    note = "small sizes" if sizes.name == "demo" else "the real sizes"
    return YAML_TEMPLATE.format(sizes_note=note, **asdict(sizes))


def readme_text(seed: int, sizes: DemoSizes) -> str:
    networks = "small networks" if sizes.name == "demo" else "the real networks' sizes (3.7 GB)"
    return README_TEMPLATE.format(seed=seed, networks=networks)


YAML_TEMPLATE = """\
# cosyserve demo model: random weights, its audio is noise. Same layout and keys as the official
# cosyvoice3.yaml, with {sizes_note}.
sample_rate: 24000
llm_input_size: {hidden}
llm_output_size: {hidden}
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2

# streaming: chunk size in tokens; < 0 left chunks means attend to all previous chunks
chunk_size: 25
num_decoding_left_chunks: -1

llm: !new:cosyvoice.llm.llm.CosyVoice3LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: 6561
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    input_size: 80
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: 6561
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: 80
        channels: {pre_lookahead_channels}
        pre_lookahead_len: 3
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: {dit_dim}
            depth: {dit_depth}
            heads: {dit_heads}
            dim_head: {dit_dim_head}
            ff_mult: 2
            mel_dim: 80
            mu_dim: 80
            spk_dim: 80
            out_channels: 80
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator
    in_channels: 80
    base_channels: {hift_channels}
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    conv_pre_look_right: 4
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: {f0_channels}

"""

README_TEMPLATE = """\
# cosyserve demo model (random weights)

This directory was written by `cosyserve demo-model` (seed {seed}). It has the layout of the official
`Fun-CosyVoice3-0.5B-2512` model directory, with {networks} whose weights are **random**: every
code path of cosyserve runs on it, offline, but **its audio is noise**, not speech. `campplus.onnx` and
`speech_tokenizer_v3.onnx` are small stand-ins with the official input and output names.

Use it to try the CLI, the REST API and the web UI without downloading the real model. For speech,
run `cosyserve download` and point cosyserve at the real model directory.
"""
