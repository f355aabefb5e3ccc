"""Every warning the service's checks can give is said in Chinese on the Chinese page, with its values
(the warnings are made by the real checks here, so a reworded one that the page no longer knows fails)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cosyserve.frontend import prompt_check
from cosyserve.frontend.text import prepare_texts
from cosyserve.frontend.tokenizer import TextTokenizer
from cosyserve.ui.i18n_warnings import say_warning, say_warnings

TRANSCRIPT = "希望你以后能够做的比我还好呦。"
HAN = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_dir / "model")


def text_warnings(tokenizer: TextTokenizer) -> list[str]:
    made = [
        prepare_texts("今天天气不错。", tokenizer=tokenizer, instruct="请开心地说"),
        prepare_texts("[sad]今天真好", tokenizer=tokenizer, instruct="emotion:happy"),
        prepare_texts("用悲伤的语气说<|endofprompt|>今天真好", tokenizer=tokenizer, instruct="emotion:happy"),
        prepare_texts("今天天气不错。", tokenizer=tokenizer, prompt_text="<|endofprompt|>"),
        prepare_texts("好。", tokenizer=tokenizer, prompt_text=TRANSCRIPT),
    ]
    return [warning for prepared in made for warning in prepared.warnings]


def recording_warnings(monkeypatch) -> list[str]:
    warnings = prompt_check._warnings(8000, -48.0, 0.02, 0.0)
    for available in (True, False):
        monkeypatch.setattr(
            prompt_check.denoise_module, "denoise_available", lambda available=available: available
        )
        warnings.append(prompt_check._noisy_warning(7.0))
    return warnings


def test_every_check_warning_is_said_in_chinese(tokenizer, monkeypatch):
    said_text = text_warnings(tokenizer)
    said_recording = recording_warnings(monkeypatch)
    assert len(said_text) == 5 and len(said_recording) == 6  # every check gave its warning
    for warning in said_text + said_recording:
        chinese = say_warning(warning, "zh")
        assert chinese != warning and HAN.search(chinese), warning
        assert say_warning(warning, "en") == warning
    zh = say_warnings(said_recording, "zh")
    assert "8000 Hz" in zh[0] and "-48 dBFS" in zh[1] and "2.00%" in zh[2]
    assert "7 dB" in zh[4] and "打开降噪" in zh[4] and "pip install" in zh[5]
    assert "'好。'" in say_warning(said_text[-1], "zh")


def test_an_unknown_warning_stays_as_it_came():
    assert say_warning("something new happened", "zh") == "something new happened"
    assert say_warnings(None, "zh") == []


def test_the_take_badge_hover_is_chinese_on_the_chinese_page():
    from cosyserve.service.quality import TakeReport, TakeScores
    from cosyserve.ui.take_badge import take_badge

    report = TakeReport(TakeScores(similarity=0.3, pace_ratio=2.5, failed=("similarity",)), takes=2)
    zh, en = take_badge(report, "zh"), take_badge(report, "en")
    assert "音色相似度 0.30" in zh and "语速比 2.50" in zh and "最长停顿" in zh and "similarity" not in zh
    assert "similarity 0.30" in en and "pace 2.50" in en
