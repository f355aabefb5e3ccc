"""The demo model directory: official layout, strict loading, determinism, safe writing, and a smoke run."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cosyserve.cli import main as cli_main
from cosyserve.engine.loading import load_flow, load_hift, load_speech_lm
from cosyserve.errors import InputError
from cosyserve.frontend.onnx_models import SpeakerEncoder, SpeechTokenizer
from cosyserve.frontend.tokenizer import TextTokenizer
from cosyserve.model.checkpoint import fold_weight_norm, read_state_dict
from cosyserve.modeldir import demo_model
from cosyserve.modeldir.demo_model import MARKER_FILE, is_demo_model, write_demo_model
from cosyserve.modeldir.model_dir import REQUIRED_FILES, ModelDir

WEIGHT_FILES = ("llm.pt", "flow.pt", "hift.pt", "campplus.onnx", "speech_tokenizer_v3.onnx")


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng_before = torch.get_rng_state()
    path = write_demo_model(tmp_path_factory.mktemp("demo") / "model", seed=0, progress=lambda _line: None)
    assert torch.equal(torch.get_rng_state(), rng_before), "writing must not touch the global RNG"
    return path


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_layout_and_config(demo_dir: Path) -> None:
    model_dir = ModelDir.open(demo_dir)  # ONNX files required
    assert model_dir.has_onnx
    assert all((demo_dir / name).is_file() for name in REQUIRED_FILES)
    config = model_dir.config
    qwen2 = config.llm.qwen2
    assert (qwen2.hidden_size, qwen2.num_hidden_layers, qwen2.num_attention_heads) == (64, 2, 4)
    assert (qwen2.num_key_value_heads, qwen2.intermediate_size, qwen2.vocab_size) == (2, 128, 151936)
    assert config.llm.speech_token_size == 6561 and config.sample_rate == 24000
    dit = config.flow.dit
    assert (dit.dim, dit.depth, dit.heads, dit.dim_head, config.flow.pre_lookahead.channels) == (
        64,
        2,
        4,
        16,
        64,
    )
    assert config.hift.base_channels == 32 and config.hift.f0_predictor.cond_channels == 32
    assert config.hift.hop_length == 480
    yaml_text = (demo_dir / "cosyvoice3.yaml").read_text()
    assert "!new:cosyvoice.llm.llm.CosyVoice3LM" in yaml_text and "!ref <llm_input_size>" in yaml_text
    assert "noise" in (demo_dir / "README.md").read_text()
    marker = json.loads((demo_dir / MARKER_FILE).read_text())
    assert marker["demo"] is True and marker["seed"] == 0
    assert is_demo_model(demo_dir)


def test_is_demo_model_false_elsewhere(tmp_path: Path) -> None:
    assert not is_demo_model(tmp_path)
    assert not is_demo_model(tmp_path / "missing")
    (tmp_path / MARKER_FILE).write_text("[1, 2]")
    assert not is_demo_model(tmp_path)


def test_checkpoints_load_strictly(demo_dir: Path) -> None:
    model_dir = ModelDir.open(demo_dir)
    lm, flow, hift = load_speech_lm(model_dir), load_flow(model_dir), load_hift(model_dir)
    assert lm.llm_decoder.weight.shape == (6761, 64)
    assert flow.input_embedding.weight.shape == (6561, 80)
    assert hift.hop_length == 480


def test_weights_are_nonzero_and_in_official_form(demo_dir: Path) -> None:
    for name in ("llm.pt", "flow.pt", "hift.pt"):
        state = read_state_dict(demo_dir / name)
        zero = [key for key, value in state.items() if not bool((value != 0).all())]
        assert not zero, f"{name}: tensors with zeros: {zero[:5]}"
    llm = read_state_dict(demo_dir / "llm.pt")
    head, embed = llm["llm.model.lm_head.weight"], llm["llm.model.model.embed_tokens.weight"]
    assert head.shape == (151936, 64)
    assert head.untyped_storage().data_ptr() == embed.untyped_storage().data_ptr()  # tied, saved once
    hift = read_state_dict(demo_dir / "hift.pt")
    assert "conv_pre.weight" not in hift and "source_downs.0.weight" in hift
    g = hift["conv_pre.parametrizations.weight.original0"]
    v = hift["conv_pre.parametrizations.weight.original1"]
    assert g.shape == (32, 1, 1) and v.shape == (32, 80, 5)
    folded = fold_weight_norm(hift)["conv_pre.weight"]
    assert torch.allclose(folded, v, rtol=1e-6, atol=0)


def test_same_keys_and_order_as_the_official_fixture(demo_dir: Path, tiny_dir: Path) -> None:
    for name in ("llm.pt", "flow.pt", "hift.pt"):
        ours, official = read_state_dict(demo_dir / name), read_state_dict(tiny_dir / "model" / name)
        assert list(ours) == list(official), name
        if name != "llm.pt":  # flow and HiFT have the fixture's sizes; the LLM is wider (64 vs 32)
            assert all(ours[k].shape == official[k].shape for k in ours), name


def test_tokenizer(demo_dir: Path) -> None:
    tokenizer = TextTokenizer.from_dir(demo_dir)
    text = "你好，世界。"
    ids = tokenizer.encode(text)
    assert all(0 <= i < 151643 for i in ids)
    assert len(ids) < len(text.encode("utf-8"))  # the learned merges apply
    assert tokenizer.decode(ids) == text
    assert tokenizer.encode("<|endofprompt|>") == [151646]
    assert tokenizer.encode("<|endoftext|><|im_start|><|im_end|>") == [151643, 151644, 151645]
    mixed = "Hello, world! こんにちは。[breath]"
    assert tokenizer.decode(tokenizer.encode(mixed), skip_special_tokens=False) == mixed
    vocab = json.loads((demo_dir / "CosyVoice-BlankEN" / "vocab.json").read_text(encoding="utf-8"))
    assert len(vocab) == 151643 and vocab["!"] == 0 and vocab["<|filler_151642|>"] == 151642
    assert (demo_dir / "CosyVoice-BlankEN" / "merges.txt").read_text().startswith("#version: 0.2\n")


def test_special_token_ids_match_the_official_tokenizer(demo_dir: Path, tiny_dir: Path) -> None:
    tokenizer = TextTokenizer.from_dir(demo_dir)
    cases = json.loads((tiny_dir / "tokenizer_cases.json").read_text(encoding="utf-8"))["cases"]
    for case in cases:
        ours = [i for i in tokenizer.encode(case["text"]) if i >= 151643]
        assert ours == [i for i in case["ids"] if i >= 151643], case["text"]


def test_standin_onnx_models_run(demo_dir: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    embedding = SpeakerEncoder.from_model_dir(demo_dir)(torch.randn(120, 80, generator=generator))
    assert embedding.shape == (1, 192) and bool(torch.isfinite(embedding).all())
    tokens = SpeechTokenizer.from_model_dir(demo_dir)(torch.randn(128, 200, generator=generator))
    assert tokens.shape == (1, 50)
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 6561


def test_deterministic_per_seed_and_overwrite(demo_dir: Path, tmp_path: Path, capsys) -> None:
    again = write_demo_model(tmp_path / "again", seed=0, progress=lambda _line: None)
    assert _hashes(again) == _hashes(demo_dir)

    with pytest.raises(InputError, match="not empty"):
        write_demo_model(again, seed=1)
    assert cli_main(["demo-model", str(again), "--seed", "1"]) == 2  # refused, one-line error
    capsys.readouterr()
    assert cli_main(["demo-model", str(again), "--seed", "1", "--force"]) == 0
    printed = capsys.readouterr()
    assert printed.out == f"{again}\n"  # the path alone, for scripts; the summary once, with the progress
    assert printed.err.count("demo model written to") == 1 and "its audio is noise" in printed.err
    other = _hashes(again)
    assert json.loads((again / MARKER_FILE).read_text())["seed"] == 1
    for name in WEIGHT_FILES:
        assert other[name] != _hashes(demo_dir)[name], name
    assert other["CosyVoice-BlankEN/vocab.json"] == _hashes(demo_dir)["CosyVoice-BlankEN/vocab.json"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging/backup left


def test_refuses_to_replace_other_things(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    for overwrite in (False, True):
        with pytest.raises(InputError):
            write_demo_model(precious, overwrite=overwrite)
    assert (precious / "notes.txt").read_text() == "keep me"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        write_demo_model(a_file, overwrite=True)


def test_failure_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(root: Path, seed: int, progress: object, sizes: object) -> None:
        (root / "cosyvoice3.yaml").write_text("partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(demo_model, "_write_all", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        write_demo_model(tmp_path / "model")
    assert list(tmp_path.iterdir()) == []


def test_end_to_end_noise(demo_dir: Path, shared_dir: Path) -> None:
    """Prompt analysis → LLM tokens → flow → HiFT: varied tokens, a sane length, audible finite noise."""
    from cosyserve.engine.speech_lm_runner import SpeechLMRunner
    from cosyserve.engine.token2wav import FlowPrompt, Token2Wav
    from cosyserve.frontend.prompt_features import analyse_prompt

    model_dir = ModelDir.open(demo_dir)
    tokenizer = TextTokenizer.from_dir(demo_dir)
    features = analyse_prompt(
        shared_dir / "audio" / "prompt_zh_24k.wav",
        SpeakerEncoder.from_model_dir(demo_dir),
        SpeechTokenizer.from_model_dir(demo_dir),
    )
    prompt_text = tokenizer.encode(
        "You are a helpful assistant.<|endofprompt|>希望你以后能够做的比我还好呦。"
    )
    text = tokenizer.encode("你好，世界。")
    runner = SpeechLMRunner(load_speech_lm(model_dir))
    tokens = list(runner.generate(text, prompt_text, features.speech_token[0], seed=0))
    assert 2 * len(text) <= len(tokens) <= 20 * len(text)
    assert all(0 <= t < 6561 for t in tokens) and len(set(tokens)) > len(tokens) // 2

    flow, hift = load_flow(model_dir), load_hift(model_dir)
    prompt = FlowPrompt(features.speech_token.long(), features.speech_feat, features.embedding)
    f0: list[torch.Tensor] = []
    hift.f0_predictor.register_forward_hook(lambda _module, _inputs, out: f0.append(out))
    wav = Token2Wav(flow, hift).synthesize(torch.tensor([tokens]), prompt).numpy()
    assert wav.shape == (len(tokens) * 2 * 480,)
    assert np.isfinite(wav).all()
    assert 0.005 < float(np.sqrt(np.mean(wav**2))) < 0.5
    assert bool((f0[0] > 10).any()) and bool((f0[0] <= 10).any())  # voiced and unvoiced paths both run


# ---- --size full ---------------------------------------------------------------------------------


def test_full_size_files_state_the_real_architecture(tmp_path: Path) -> None:
    """The YAML and Qwen2 config.json of `--size full` read back as `model.sizes.full_size_config`
    (the weights themselves, 3.7 GB, are not written here)."""
    from cosyserve.model.config import read_cosyvoice3_config
    from cosyserve.model.sizes import full_size_config
    from cosyserve.modeldir.demo_files import DEMO_SIZES, full_sizes, sizes_named, yaml_text
    from cosyserve.modeldir.demo_tokenizer import tokenizer_files

    sizes = sizes_named("full")
    assert sizes == full_sizes() and sizes_named("demo") == DEMO_SIZES
    (tmp_path / "cosyvoice3.yaml").write_text(yaml_text(sizes), encoding="utf-8")
    (tmp_path / "config.json").write_text(tokenizer_files(sizes.llm_sizes())["config.json"], encoding="utf-8")
    config = read_cosyvoice3_config(tmp_path / "cosyvoice3.yaml", tmp_path / "config.json")
    assert config == full_size_config()
    with pytest.raises(ValueError, match="unknown demo model size"):
        sizes_named("huge")


def test_unknown_size_is_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="size"):
        write_demo_model(tmp_path / "model", size="huge")
    assert not (tmp_path / "model").exists()


def test_cli_takes_the_size(monkeypatch, tmp_path: Path) -> None:
    calls = []
    monkeypatch.setattr(
        demo_model, "write_demo_model", lambda *args, **kwargs: calls.append(kwargs) or tmp_path
    )
    assert cli_main(["demo-model", str(tmp_path / "m"), "--size", "full"]) == 0
    assert calls[0]["size"] == "full"
