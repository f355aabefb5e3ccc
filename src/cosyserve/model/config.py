"""Model architecture configs: frozen dataclasses read from `cosyvoice3.yaml` and Qwen2 `config.json`.

Every size comes from the files; nothing here assumes the 0.5B model. Field names follow the
official YAML keys so a reader can match them line by line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosyserve.errors import ConfigError
from cosyserve.model.hyperyaml import Tagged, load_hyperyaml


@dataclass(frozen=True)
class Qwen2Config:
    """The Qwen2 text transformer inside the LLM (from `CosyVoice-BlankEN/config.json`)."""

    hidden_size: int  # 896 in the 0.5B model
    intermediate_size: int  # SwiGLU inner width
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int  # grouped-query attention: heads share K/V in groups
    vocab_size: int  # text vocabulary (151936); only embed_tokens uses it at inference
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class SamplingConfig:
    """Repetition-aware sampling (`ras_sampling`) parameters."""

    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10  # look-back window for the repetition rule
    tau_r: float = 0.1  # repetition ratio: re-draw if count >= win_size * tau_r


@dataclass(frozen=True)
class LLMConfig:
    """`CosyVoice3LM`: Qwen2 + speech token embedding and decoder."""

    llm_input_size: int
    llm_output_size: int
    speech_token_size: int  # 6561 codes; ids >= this are special (sos, eos, task_id, ...)
    qwen2: Qwen2Config
    sampling: SamplingConfig

    @property
    def sos(self) -> int:
        return self.speech_token_size

    @property
    def eos(self) -> int:
        return self.speech_token_size + 1

    @property
    def task_id(self) -> int:
        return self.speech_token_size + 2

    @property
    def decoder_size(self) -> int:
        """Rows of `llm_decoder` and `speech_embedding`: the codes plus 200 special ids."""
        return self.speech_token_size + 200


@dataclass(frozen=True)
class PreLookaheadConfig:
    in_channels: int
    channels: int
    pre_lookahead_len: int


@dataclass(frozen=True)
class DiTConfig:
    """The flow-matching estimator (`cosyvoice.flow.DiT.dit.DiT`)."""

    dim: int
    depth: int
    heads: int
    dim_head: int
    ff_mult: int
    mel_dim: int
    mu_dim: int
    spk_dim: int
    out_channels: int
    static_chunk_size: int  # mel frames per attention chunk when streaming
    num_decoding_left_chunks: int  # < 0: attend to all previous chunks


@dataclass(frozen=True)
class CFMConfig:
    """Conditional flow matching solver parameters."""

    in_channels: int
    spk_emb_dim: int
    sigma_min: float
    solver: str
    t_scheduler: str
    inference_cfg_rate: float


@dataclass(frozen=True)
class FlowConfig:
    """`CausalMaskedDiffWithDiT`: speech tokens → 80-bin mel."""

    input_size: int
    output_size: int
    spk_embed_dim: int
    vocab_size: int
    input_frame_rate: int
    token_mel_ratio: int
    pre_lookahead_len: int
    pre_lookahead: PreLookaheadConfig
    cfm: CFMConfig
    dit: DiTConfig


@dataclass(frozen=True)
class F0PredictorConfig:
    num_class: int
    in_channels: int
    cond_channels: int


@dataclass(frozen=True)
class HiFTConfig:
    """`CausalHiFTGenerator`: mel → 24 kHz waveform."""

    in_channels: int
    base_channels: int
    nb_harmonics: int
    sampling_rate: int
    nsf_alpha: float
    nsf_sigma: float
    nsf_voiced_threshold: float
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    istft_n_fft: int
    istft_hop_len: int
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    source_resblock_kernel_sizes: tuple[int, ...]
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    lrelu_slope: float
    audio_limit: float
    conv_pre_look_right: int
    f0_predictor: F0PredictorConfig

    @property
    def hop_length(self) -> int:
        """Waveform samples per mel frame (480 at 24 kHz / 50 Hz)."""
        total = self.istft_hop_len
        for rate in self.upsample_rates:
            total *= rate
        return total


@dataclass(frozen=True)
class CosyVoice3Config:
    """Everything the engine needs to build the three networks of a model directory."""

    sample_rate: int
    token_frame_rate: int
    token_mel_ratio: int
    chunk_size: int  # streaming chunk, in speech tokens
    llm: LLMConfig
    flow: FlowConfig
    hift: HiFTConfig


class _Section:
    """Typed access to the kwargs of one tagged YAML node, with errors that name the missing key."""

    def __init__(self, node: Any, where: str, expected_class: str | None = None) -> None:
        if not isinstance(node, Tagged):
            raise ConfigError(f"{where}: expected a `!new:` section, found {type(node).__name__}")
        if expected_class and node.class_name != expected_class:
            raise ConfigError(f"{where}: expected {expected_class}, found {node.class_name}")
        self.node, self.where = node, where

    def get(self, key: str, default: Any = ...) -> Any:
        if key in self.node.kwargs:
            return self.node.kwargs[key]
        if default is ...:
            raise ConfigError(f"{self.where}: missing required key {key!r}")
        return default

    def section(self, key: str, expected_class: str | None = None) -> _Section:
        return _Section(self.get(key), f"{self.where}.{key}", expected_class)

    def int(self, key: str, default: Any = ...) -> int:
        return int(self.get(key, default))

    def float(self, key: str, default: Any = ...) -> float:
        return float(self.get(key, default))


def _int_tuple(values: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def read_qwen2_config(path: Path) -> Qwen2Config:
    """Read the Qwen2 `config.json` that ships in `CosyVoice-BlankEN/`."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read Qwen2 config {path}: {exc}") from exc
    try:
        return Qwen2Config(
            hidden_size=int(data["hidden_size"]),
            intermediate_size=int(data["intermediate_size"]),
            num_hidden_layers=int(data["num_hidden_layers"]),
            num_attention_heads=int(data["num_attention_heads"]),
            num_key_value_heads=int(data.get("num_key_value_heads", data["num_attention_heads"])),
            vocab_size=int(data["vocab_size"]),
            rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
            rope_theta=float(data.get("rope_theta", 10000.0)),
            max_position_embeddings=int(data.get("max_position_embeddings", 32768)),
        )
    except KeyError as exc:
        raise ConfigError(f"{path}: missing required key {exc.args[0]!r}") from exc


def _llm_config(yaml_data: dict[str, Any], qwen2: Qwen2Config) -> LLMConfig:
    llm = _Section(yaml_data.get("llm"), "llm", "CosyVoice3LM")
    sampling_node = llm.get("sampling", None)
    sampling = SamplingConfig()
    if isinstance(sampling_node, Tagged):
        kw = sampling_node.kwargs
        sampling = SamplingConfig(
            top_p=float(kw.get("top_p", sampling.top_p)),
            top_k=int(kw.get("top_k", sampling.top_k)),
            win_size=int(kw.get("win_size", sampling.win_size)),
            tau_r=float(kw.get("tau_r", sampling.tau_r)),
        )
    config = LLMConfig(
        llm_input_size=llm.int("llm_input_size"),
        llm_output_size=llm.int("llm_output_size"),
        speech_token_size=llm.int("speech_token_size"),
        qwen2=qwen2,
        sampling=sampling,
    )
    if config.llm_input_size != qwen2.hidden_size:
        raise ConfigError(
            f"llm_input_size {config.llm_input_size} in the YAML does not match the Qwen2 "
            f"hidden_size {qwen2.hidden_size} in CosyVoice-BlankEN/config.json"
        )
    return config


def _flow_config(yaml_data: dict[str, Any]) -> FlowConfig:
    flow = _Section(yaml_data.get("flow"), "flow", "CausalMaskedDiffWithDiT")
    pre = flow.section("pre_lookahead_layer")
    decoder = flow.section("decoder")
    cfm_params = decoder.get("cfm_params")
    cfm_content = (
        cfm_params.kwargs.get("content", cfm_params.kwargs) if isinstance(cfm_params, Tagged) else {}
    )
    dit = decoder.section("estimator", "DiT")
    return FlowConfig(
        input_size=flow.int("input_size"),
        output_size=flow.int("output_size"),
        spk_embed_dim=flow.int("spk_embed_dim"),
        vocab_size=flow.int("vocab_size"),
        input_frame_rate=flow.int("input_frame_rate"),
        token_mel_ratio=flow.int("token_mel_ratio"),
        pre_lookahead_len=flow.int("pre_lookahead_len"),
        pre_lookahead=PreLookaheadConfig(
            in_channels=pre.int("in_channels"),
            channels=pre.int("channels"),
            pre_lookahead_len=pre.int("pre_lookahead_len"),
        ),
        cfm=CFMConfig(
            in_channels=decoder.int("in_channels"),
            spk_emb_dim=decoder.int("spk_emb_dim"),
            sigma_min=float(cfm_content.get("sigma_min", 1e-6)),
            solver=str(cfm_content.get("solver", "euler")),
            t_scheduler=str(cfm_content.get("t_scheduler", "cosine")),
            inference_cfg_rate=float(cfm_content.get("inference_cfg_rate", 0.7)),
        ),
        dit=DiTConfig(
            dim=dit.int("dim"),
            depth=dit.int("depth"),
            heads=dit.int("heads"),
            dim_head=dit.int("dim_head"),
            ff_mult=dit.int("ff_mult", 4),
            mel_dim=dit.int("mel_dim"),
            mu_dim=dit.int("mu_dim"),
            spk_dim=dit.int("spk_dim"),
            out_channels=dit.int("out_channels"),
            static_chunk_size=dit.int("static_chunk_size", 0),
            num_decoding_left_chunks=dit.int("num_decoding_left_chunks", -1),
        ),
    )


def _hift_config(yaml_data: dict[str, Any]) -> HiFTConfig:
    hift = _Section(yaml_data.get("hift"), "hift", "CausalHiFTGenerator")
    f0 = hift.section("f0_predictor")
    istft = hift.get("istft_params")
    return HiFTConfig(
        in_channels=hift.int("in_channels"),
        base_channels=hift.int("base_channels"),
        nb_harmonics=hift.int("nb_harmonics"),
        sampling_rate=hift.int("sampling_rate"),
        nsf_alpha=hift.float("nsf_alpha"),
        nsf_sigma=hift.float("nsf_sigma"),
        nsf_voiced_threshold=hift.float("nsf_voiced_threshold"),
        upsample_rates=_int_tuple(hift.get("upsample_rates")),
        upsample_kernel_sizes=_int_tuple(hift.get("upsample_kernel_sizes")),
        istft_n_fft=int(istft["n_fft"]),
        istft_hop_len=int(istft["hop_len"]),
        resblock_kernel_sizes=_int_tuple(hift.get("resblock_kernel_sizes")),
        resblock_dilation_sizes=tuple(_int_tuple(d) for d in hift.get("resblock_dilation_sizes")),
        source_resblock_kernel_sizes=_int_tuple(hift.get("source_resblock_kernel_sizes")),
        source_resblock_dilation_sizes=tuple(
            _int_tuple(d) for d in hift.get("source_resblock_dilation_sizes")
        ),
        lrelu_slope=hift.float("lrelu_slope", 0.1),
        audio_limit=hift.float("audio_limit", 0.99),
        conv_pre_look_right=hift.int("conv_pre_look_right", 4),
        f0_predictor=F0PredictorConfig(
            num_class=f0.int("num_class", 1),
            in_channels=f0.int("in_channels"),
            cond_channels=f0.int("cond_channels"),
        ),
    )


def read_cosyvoice3_config(yaml_path: Path, qwen2_config_path: Path) -> CosyVoice3Config:
    """Build the full model config from `cosyvoice3.yaml` and the Qwen2 `config.json`."""
    data = load_hyperyaml(yaml_path)
    try:
        return CosyVoice3Config(
            sample_rate=int(data["sample_rate"]),
            token_frame_rate=int(data.get("token_frame_rate", 25)),
            token_mel_ratio=int(data.get("token_mel_ratio", 2)),
            chunk_size=int(data.get("chunk_size", 25)),
            llm=_llm_config(data, read_qwen2_config(qwen2_config_path)),
            flow=_flow_config(data),
            hift=_hift_config(data),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{yaml_path.name}: unexpected structure ({exc})") from exc
