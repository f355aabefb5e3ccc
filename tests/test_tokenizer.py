"""The CosyVoice3 text tokenizer against the official ids in `tokenizer_cases.json`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cosyserve.errors import ModelDirError
from cosyserve.frontend.tokenizer import COSYVOICE3_SPECIAL_TOKENS, TextTokenizer
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity import tokenizer as tokenizer_parity


@pytest.fixture(scope="module")
def golden(tiny_dir: Path) -> dict:
    return json.loads((tiny_dir / "tokenizer_cases.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_dir / "model" / "CosyVoice-BlankEN")


def test_every_case_matches_the_official_ids(tokenizer: TextTokenizer, golden: dict) -> None:
    mismatches = [
        (case["text"], tokenizer.encode(case["text"]), case["ids"])
        for case in golden["cases"]
        if tokenizer.encode(case["text"]) != case["ids"]
    ]
    assert not mismatches
    assert len(golden["cases"]) >= 10


def test_special_tokens_in_official_order(tokenizer: TextTokenizer, golden: dict) -> None:
    assert list(tokenizer.special_tokens) == golden["special_tokens"]
    assert len(COSYVOICE3_SPECIAL_TOKENS) == 280
    assert tokenizer.token_to_id("<|endoftext|>") == 151643
    assert tokenizer.token_to_id("<|im_start|>") == 151644
    assert tokenizer.token_to_id("<|im_end|>") == 151645
    assert tokenizer.endofprompt_id == 151646
    # Each token that is new gets the next id, in list order (the first two already exist in Qwen2).
    for offset, token in enumerate(COSYVOICE3_SPECIAL_TOKENS[2:]):
        assert tokenizer.token_to_id(token) == 151646 + offset
    assert tokenizer.token_to_id("no such token") is None


def test_special_tokens_written_in_text_are_single_ids(tokenizer: TextTokenizer) -> None:
    ids = tokenizer.encode("[breath]<strong>[h][ào]</strong>[M][AY0]<|endofprompt|>")
    assert ids == [
        tokenizer.token_to_id(token)
        for token in ("[breath]", "<strong>", "[h]", "[ào]", "</strong>", "[M]", "[AY0]", "<|endofprompt|>")
    ]


def test_plain_text_round_trips(tokenizer: TextTokenizer, golden: dict) -> None:
    plain = [
        c["text"]
        for c in golden["cases"]
        if not any(t in c["text"] for t in (*golden["special_tokens"], "<|"))
    ]
    assert len(plain) >= 4
    for text in plain:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_decode_skips_special_tokens_unless_asked(tokenizer: TextTokenizer) -> None:
    text = "You are a helpful assistant.<|endofprompt|>[breath]你好"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == "You are a helpful assistant.你好"
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_from_dir_accepts_the_model_directory(tiny_dir: Path, tokenizer: TextTokenizer) -> None:
    from_model_dir = TextTokenizer.from_dir(tiny_dir / "model")
    assert from_model_dir.encode("你好 world") == tokenizer.encode("你好 world")


def test_missing_tokenizer_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ModelDirError, match=r"vocab\.json is missing"):
        TextTokenizer.from_dir(tmp_path)


def test_parity_check_passes(tiny_dir: Path) -> None:
    results = tokenizer_parity.run(ModelDir.open(tiny_dir / "model", require_onnx=False), tiny_dir)
    assert [r.name for r in results] == ["tokenizer special tokens", "tokenizer ids"]
    assert all(r.passed and r.max_abs_diff == 0.0 for r in results)


def test_parity_check_reports_the_first_mismatch(tiny_dir: Path, golden: dict, tmp_path: Path) -> None:
    broken = json.loads(json.dumps(golden))
    broken["cases"][3]["ids"][5] += 1
    broken["special_tokens"][4], broken["special_tokens"][5] = broken["special_tokens"][5], "<strong>"
    (tmp_path / "tokenizer_cases.json").write_text(json.dumps(broken, ensure_ascii=False), encoding="utf-8")

    specials, ids = tokenizer_parity.run(ModelDir.open(tiny_dir / "model", require_onnx=False), tmp_path)
    assert not specials.passed and "entry 4" in specials.detail
    assert not ids.passed and ids.max_abs_diff == float("inf")
    assert "case 3" in ids.detail and "first difference at id 5" in ids.detail


def test_decode_keeps_non_ascii_special_tokens(tiny_dir: Path) -> None:
    tokenizer = TextTokenizer.from_dir(tiny_dir / "model")
    text = "重[ch][óng]庆<|endofprompt|>[breath]好"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert tokenizer.decode(ids) == "重庆好"
