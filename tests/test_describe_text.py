"""`describe_text` and `cosyserve normalize`: what the model will read, from the typed text to its tokens."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cosyserve.cli import main
from cosyserve.frontend.text.describe import describe_text, readable_pieces
from cosyserve.frontend.text.prepare import prepare_plain
from cosyserve.frontend.tokenizer import TextTokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_dir / "model" / "CosyVoice-BlankEN")


def test_chinese_text_with_corrections(tokenizer: TextTokenizer) -> None:
    text = "今天花了¥12.50。。。！！比分3-2，[breath]真好。"
    description = describe_text(text, tokenizer)
    assert description.language == "zh"
    assert description.spoken == "今天花了十二点五元。比分三比二，[breath]真好。"
    assert description.official == "今天花了十二点五零元。。。！！比分三减二，[breath]真好。"
    assert [c.rule for c in description.corrections] == [
        "score",
        "money with trailing zeros",
        "runs of punctuation",
    ]
    assert "".join(description.segments) == description.spoken
    assert description.mode == "cross_lingual" and description.prompt is None
    for lm_input, segment in zip(description.lm_inputs, description.segments, strict=True):
        assert lm_input.text.endswith(segment)
        assert "".join(lm_input.pieces) == lm_input.text
        assert list(lm_input.token_ids) == tokenizer.encode(lm_input.text)
    assert "[breath]" in description.lm_inputs[-1].pieces
    with pytest.raises(dataclasses.FrozenInstanceError):
        description.spoken = ""  # type: ignore[misc]


def test_modes_and_prompt(tokenizer: TextTokenizer) -> None:
    zero_shot = describe_text("It costs $12.50.", tokenizer, prompt_text="Hello there.")
    assert zero_shot.mode == "zero_shot"
    assert zero_shot.spoken == "It costs twelve dollars and fifty cents."
    assert zero_shot.prompt is not None and "<|endofprompt|>" in zero_shot.prompt.pieces
    assert zero_shot.lm_inputs[0].text == "It costs twelve dollars and fifty cents."
    instruct = describe_text("你好", tokenizer, instruct="dialect:cantonese")
    assert instruct.mode == "instruct" and instruct.instruction
    assert not instruct.corrections and instruct.official == instruct.spoken == "你好"


def test_spoken_form_is_what_synthesis_normalises(tokenizer: TextTokenizer) -> None:
    lexicon = {"行长": "hang2 zhang3"}
    text = "[sad]行长花了¥12.50。"
    description = describe_text(text, tokenizer, lexicon=lexicon)
    from cosyserve.frontend.text.lexicon import Lexicon

    assert description.spoken == prepare_plain("行长花了¥12.50。", Lexicon(lexicon))
    assert description.instruction is not None  # the leading tag became the instruction


def test_readable_pieces_join_split_characters(tokenizer: TextTokenizer) -> None:
    ids = tokenizer.encode("呦x")
    pieces = readable_pieces(ids, tokenizer)
    assert "".join(pieces) == "呦x" and "\ufffd" not in "".join(pieces)


def test_cli_prints_the_reading(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["normalize", "--model", str(tiny_dir / "model"), "It costs $12.50!!!"]) == 0
    out = capsys.readouterr().out
    assert "spoken       It costs twelve dollars and fifty cents!" in out
    assert "official     It costs twelve point five dollars!!!" in out
    assert "money: $12.50 -> twelve dollars and fifty cents" in out
    assert "sentences    1. It costs twelve dollars and fifty cents!" in out
    assert "LM reads     1. You are a helpful assistant.<|endofprompt|>It costs" in out


def test_cli_json_and_text_file(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text_file = tmp_path / "text.txt"
    text_file.write_text("需要3～5天。", encoding="utf-8")
    model = str(tiny_dir / "model" / "CosyVoice-BlankEN")
    assert main(["normalize", "--model", model, "--text-file", str(text_file), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["spoken"] == "需要三到五天。" and data["segments"] == ["需要三到五天。"]
    assert data["corrections"][0]["rule"] == "range with a dash"


def test_cli_errors(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["normalize", "--model", str(tiny_dir / "model")]) == 2
    assert "give the text" in capsys.readouterr().err
    assert main(["normalize", "--model", str(tmp_path), "hello"]) == 2
    assert "holds no tokenizer" in capsys.readouterr().err
    assert main(["normalize", "--model", str(tiny_dir / "model"), "   "]) == 2
    assert "empty" in capsys.readouterr().err
