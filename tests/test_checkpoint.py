"""Strict state-dict loading, weight-norm folding in both layouts, and model-directory validation."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from cosyserve.errors import CheckpointError, ModelDirError
from cosyserve.model.checkpoint import fold_weight_norm, load_into, read_state_dict
from cosyserve.modeldir.model_dir import ModelDir


class TwoConvs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Conv1d(4, 6, 3)
        self.post = nn.Conv1d(6, 2, 1)


def _weight_normed(layout: str) -> tuple[dict[str, torch.Tensor], TwoConvs]:
    """A state dict with weight norm on `pre` in the given layout, and the plain module it defines."""
    torch.manual_seed(0)
    source = TwoConvs()
    if layout == "parametrizations":
        nn.utils.parametrizations.weight_norm(source.pre)
    else:
        nn.utils.weight_norm(source.pre)  # legacy weight_g / weight_v
    with torch.no_grad():
        source.pre.bias.add_(1.0)
    plain = TwoConvs()
    with torch.no_grad():
        plain.pre.weight.copy_(source.pre.weight)
        plain.pre.bias.copy_(source.pre.bias)
        plain.post.load_state_dict(source.post.state_dict())
    return source.state_dict(), plain


@pytest.mark.parametrize("layout", ["parametrizations", "legacy"])
def test_both_weight_norm_layouts_fold(layout: str) -> None:
    state, plain = _weight_normed(layout)
    assert any(("original0" in k) or k.endswith("weight_g") for k in state)
    module = TwoConvs()
    load_into(module, fold_weight_norm(state), "test.pt")
    x = torch.randn(1, 4, 9)
    torch.testing.assert_close(module.post(module.pre(x)), plain.post(plain.pre(x)), atol=1e-6, rtol=1e-6)


def test_incomplete_weight_norm_pair() -> None:
    state, _ = _weight_normed("legacy")
    del state["pre.weight_v"]
    with pytest.raises(CheckpointError, match="pre is incomplete"):
        fold_weight_norm(state)


def test_strict_load_lists_every_problem() -> None:
    state = TwoConvs().state_dict()
    del state["pre.bias"]
    state["post.weight"] = torch.zeros(3, 6, 1)
    state["extra.weight"] = torch.zeros(1)
    with pytest.raises(CheckpointError) as info:
        load_into(TwoConvs(), state, "flow.pt")
    message = str(info.value)
    assert "flow.pt" in message and "missing: pre.bias" in message and "unexpected: extra.weight" in message
    assert "post.weight (checkpoint (3, 6, 1), model (2, 6, 1))" in message


def test_read_state_dict_rejects_truncated_and_foreign(tmp_path: Path) -> None:
    good = tmp_path / "good.pt"
    torch.save(TwoConvs().state_dict(), good)
    assert set(read_state_dict(good)) == set(TwoConvs().state_dict())
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        read_state_dict(truncated)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": [1, 2, 3]}, foreign)
    with pytest.raises(CheckpointError, match="not a plain state dict"):
        read_state_dict(foreign)


@pytest.fixture()
def model_copy(tiny_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(tiny_dir / "model", target)
    for name in ("campplus.onnx", "speech_tokenizer_v3.onnx"):
        (target / name).write_bytes(b"\0" * 128)  # presence/size only; ONNX parsing is tested elsewhere
    target.chmod(0o755)
    for child in target.rglob("*"):
        child.chmod(0o755 if child.is_dir() else 0o644)
    return target


def test_model_dir_accepts_official_layout(model_copy: Path) -> None:
    model_dir = ModelDir.open(model_copy)
    assert model_dir.has_onnx and model_dir.config.flow.dit.depth == 2


@pytest.mark.parametrize(
    "name",
    [
        "cosyvoice3.yaml",
        "llm.pt",
        "flow.pt",
        "hift.pt",
        "campplus.onnx",
        "speech_tokenizer_v3.onnx",
        "CosyVoice-BlankEN/config.json",
        "CosyVoice-BlankEN/vocab.json",
        "CosyVoice-BlankEN/merges.txt",
    ],
)
def test_missing_file_is_named(model_copy: Path, name: str) -> None:
    (model_copy / name).unlink()
    with pytest.raises(ModelDirError, match=rf"{Path(name).name} is missing.*cosyserve download"):
        ModelDir.open(model_copy)


@pytest.mark.parametrize("name", ["llm.pt", "flow.pt", "hift.pt"])
def test_truncated_checkpoint_is_named(model_copy: Path, name: str) -> None:
    data = (model_copy / name).read_bytes()
    (model_copy / name).write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelDirError, match=rf"{name} is (truncated|corrupt)"):
        ModelDir.open(model_copy)


def test_empty_file_is_truncated(model_copy: Path) -> None:
    (model_copy / "campplus.onnx").write_bytes(b"")
    with pytest.raises(ModelDirError, match=r"campplus\.onnx is truncated"):
        ModelDir.open(model_copy)


def test_missing_dir_and_cosyvoice2(tmp_path: Path) -> None:
    with pytest.raises(ModelDirError, match="does not exist"):
        ModelDir.open(tmp_path / "nope")
    (tmp_path / "cosyvoice2.yaml").write_text("x: 1\n")
    with pytest.raises(ModelDirError, match="CosyVoice2 model"):
        ModelDir.open(tmp_path)


def test_parity_fixture_needs_no_onnx(tiny_dir: Path) -> None:
    model_dir = ModelDir.open(tiny_dir / "model", require_onnx=False)
    assert not model_dir.has_onnx
    with pytest.raises(ModelDirError, match=r"campplus\.onnx is missing"):
        ModelDir.open(tiny_dir / "model")
