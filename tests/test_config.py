"""Reading cosyvoice3.yaml as data: tags are never constructed, refs and arithmetic resolve."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cosyserve.errors import ConfigError
from cosyserve.model.config import read_cosyvoice3_config
from cosyserve.model.hyperyaml import Tagged, load_hyperyaml

# The real Fun-CosyVoice3-0.5B-2512 sizes, substituted into the tiny YAML (same structure, same keys).
REAL_SIZES = {
    "llm_input_size: 32": "llm_input_size: 896",
    "llm_output_size: 32": "llm_output_size: 896",
    "        channels: 64": "        channels: 1024",
    "dim: 64": "dim: 1024",
    "depth: 2": "depth: 22",
    "heads: 4": "heads: 16",
    "dim_head: 16": "dim_head: 64",
    "base_channels: 32": "base_channels: 512",
    "cond_channels: 32": "cond_channels: 512",
}
REAL_QWEN2 = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
}


def write_real_size_model(tiny_model: Path, target: Path) -> Path:
    """A copy of the tiny config files with the real model's sizes (no weights)."""
    (target / "CosyVoice-BlankEN").mkdir(parents=True)
    text = (tiny_model / "cosyvoice3.yaml").read_text()
    for old, new in REAL_SIZES.items():
        assert old in text, old
        text = text.replace(old, new)
    (target / "cosyvoice3.yaml").write_text(text)
    qwen = json.loads((tiny_model / "CosyVoice-BlankEN" / "config.json").read_text())
    qwen.update(REAL_QWEN2)
    (target / "CosyVoice-BlankEN" / "config.json").write_text(json.dumps(qwen))
    return target


def test_tags_are_data_not_objects(tiny_dir: Path) -> None:
    data = load_hyperyaml(tiny_dir / "model" / "cosyvoice3.yaml")
    assert isinstance(data["llm"], Tagged)
    assert data["llm"].kind == "new" and data["llm"].target == "cosyvoice.llm.llm.CosyVoice3LM"
    assert data["__set_seed1"] == Tagged("apply", "random.seed", args=(1986,))
    assert data["get_tokenizer"].kind == "name"
    # !ref with arithmetic: static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
    assert data["flow"].kwargs["decoder"].kwargs["estimator"].kwargs["static_chunk_size"] == 50
    # a !ref to a tagged node resolves to the same data
    assert data["hifigan"].kwargs["generator"] == data["hift"]


def test_tiny_config_numbers(tiny_dir: Path) -> None:
    model = tiny_dir / "model"
    config = read_cosyvoice3_config(model / "cosyvoice3.yaml", model / "CosyVoice-BlankEN" / "config.json")
    assert config.llm.qwen2.hidden_size == 32 and config.llm.qwen2.num_hidden_layers == 2
    assert (config.llm.sos, config.llm.eos, config.llm.task_id) == (6561, 6562, 6563)
    assert (
        config.flow.dit.dim == 64 and config.flow.dit.depth == 2 and config.flow.cfm.inference_cfg_rate == 0.7
    )
    assert config.flow.cfm.sigma_min == pytest.approx(1e-6)
    assert config.hift.base_channels == 32 and config.hift.hop_length == 480
    assert config.hift.resblock_dilation_sizes == ((1, 3, 5), (1, 3, 5), (1, 3, 5))


def test_real_model_numbers(tiny_dir: Path, tmp_path: Path) -> None:
    model = write_real_size_model(tiny_dir / "model", tmp_path / "real")
    config = read_cosyvoice3_config(model / "cosyvoice3.yaml", model / "CosyVoice-BlankEN" / "config.json")
    assert config.llm.qwen2.hidden_size == 896 and config.llm.qwen2.num_hidden_layers == 24
    assert config.flow.dit.dim == 1024 and config.flow.dit.depth == 22
    assert config.hift.base_channels == 512 and config.hift.f0_predictor.cond_channels == 512


def test_yaml_never_imports(tmp_path: Path) -> None:
    path = tmp_path / "evil.yaml"
    path.write_text("x: !new:os.system\n  command: 'touch pwned'\ny: !apply:os.remove ['nothing']\n")
    data = load_hyperyaml(path)
    assert data["x"].target == "os.system" and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: !ref <missing>\n", "does not define"),
        ("a: !ref <b>\nb: !ref <a>\n", "circular"),
        ("a: 1\nb: !ref __import__('os') <a>\n", "!ref expression"),
        ("- just a list\n", "mapping"),
        ("a: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_yaml_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_hyperyaml(path)


def test_llm_size_mismatch_is_explained(tiny_dir: Path, tmp_path: Path) -> None:
    shutil.copytree(tiny_dir / "model" / "CosyVoice-BlankEN", tmp_path / "CosyVoice-BlankEN")
    text = (
        (tiny_dir / "model" / "cosyvoice3.yaml")
        .read_text()
        .replace("llm_input_size: 32", "llm_input_size: 64")
    )
    (tmp_path / "cosyvoice3.yaml").write_text(text)
    with pytest.raises(ConfigError, match="does not match the Qwen2 hidden_size"):
        read_cosyvoice3_config(tmp_path / "cosyvoice3.yaml", tmp_path / "CosyVoice-BlankEN" / "config.json")
