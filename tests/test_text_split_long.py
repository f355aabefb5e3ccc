"""Long texts cut into requests (a long-text job's pieces) with the frontend's one splitter."""

from __future__ import annotations

from cosyserve.frontend.text.split import split_long_text


def test_a_short_text_is_one_piece() -> None:
    assert split_long_text("  你好。 ", 10) == ["  你好。 "]


def test_pieces_end_at_sentences_and_stay_within_the_limit() -> None:
    text = "第一句话。第二句话！Third sentence here. 第四句？" * 3
    pieces = split_long_text(text, 20)
    assert len(pieces) > 1 and all(len(piece) <= 20 for piece in pieces)
    assert "".join(pieces) == text
    assert all(piece.rstrip()[-1] in "。！.？" for piece in pieces)


def test_a_long_sentence_is_cut_at_commas_then_anywhere() -> None:
    text = "一二三四五，六七八九十，" + "长" * 25 + "。"
    pieces = split_long_text(text, 10)
    assert pieces[:2] == ["一二三四五，", "六七八九十，"]
    assert all(len(piece) <= 10 for piece in pieces) and "".join(pieces) == text


def test_lines_end_sentences_and_lone_punctuation_is_dropped() -> None:
    assert split_long_text("第一行\n第二行\n", 5) == ["第一行\n", "第二行\n"]
    assert split_long_text("好" * 5 + "。" * 6, 5) == ["好" * 5]
