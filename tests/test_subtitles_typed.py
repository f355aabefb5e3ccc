"""Subtitles show the typed text at the spoken segments' times (issue 29): finding the typed words of
each segment (`frontend.text.typed`) and the one SRT/WebVTT builder (`service.subtitles`)."""

from __future__ import annotations

from cosyserve.errors import InputError
from cosyserve.frontend.text.normalize import normalize_text
from cosyserve.frontend.text.typed import MAX_JOINED, clauses, typed_segments
from cosyserve.service.outcomes import SentenceTiming
from cosyserve.service.subtitles import cues, manifest_timings, to_srt, to_vtt


def _zh(piece: str) -> str:
    return normalize_text(piece, "zh")


def test_clauses_never_cut_a_number_or_an_address() -> None:
    assert clauses("圆周率是3.14，共1,234人。访问a.com吧") == ["圆周率是3.14，", "共1,234人。", "访问a.com吧"]
    assert clauses("Hi. Bye.\nNext") == ["Hi.", " Bye.\n", "Next"]


def test_each_segment_gets_the_typed_words_it_speaks() -> None:
    segments = ["第二课：你好。", "今天二月二日，下午两点见。"]
    typed = typed_segments("第2课：你好。今天2月2日，下午2点见", segments, read=_zh, show=str.strip)
    assert typed == ["第2课：你好。", "今天2月2日，下午2点见"]


def test_a_typed_piece_spoken_as_several_segments_gives_one_cue() -> None:
    # One clause that reads into two segments: the first segment gets it, the second continues it.
    typed = typed_segments("AB", ["a.", "b."], read=str.lower, show=str)
    assert typed == ["AB", ""]


def test_a_clause_read_only_with_its_neighbour_joins_it() -> None:
    def read(piece: str) -> str:  # `No.` alone reads otherwise than `No. 5`
        return piece.replace("No. 5", "number five")

    typed = typed_segments(
        "Room No. 5 is here. Bye.", ["Room number five is here.", "Bye."], read=read, show=str
    )
    assert typed == ["Room No. 5 is here.", " Bye."]


def test_text_no_reading_matches_is_kept_whole_in_the_last_cue() -> None:
    same = lambda piece: piece  # noqa: E731
    assert typed_segments("x。y。z。", ["甲。", "乙。"], read=same, show=str) == ["x。y。z。", ""]
    assert typed_segments("甲。x。y。", ["甲。", "乙。"], read=same, show=str) == ["甲。", "x。y。"]


def test_clauses_that_fail_to_read_are_read_with_the_next() -> None:
    def read(piece: str) -> str:
        if piece.count("(") != piece.count(")"):
            raise InputError("a pronunciation cut in two")
        return piece.replace("(", "").replace(")", "")

    typed = typed_segments("a(b,c)d. e.", ["abcd.", "e."], read=read, show=str)
    assert typed == ["a(b,c)d.", " e."]


def test_reading_clause_by_clause_gives_up_after_a_bound() -> None:
    calls = []

    def read(piece: str) -> str:
        calls.append(piece)
        return "never"

    typed = typed_segments("。".join("x" * 50) + "。", ["甲。", "乙。"], read=read, show=str)
    assert len(calls) == MAX_JOINED and typed == ["。".join("x" * 50) + "。", ""]


def test_one_segment_takes_the_whole_text_without_reading_it_again() -> None:
    def read(piece: str) -> str:
        raise AssertionError("not needed")

    assert typed_segments(" 第2课：你好 ", ["第二课：你好。"], read=read, show=str.strip) == ["第2课：你好"]


def test_a_cue_without_typed_text_shows_its_spoken_segment() -> None:
    assert typed_segments("……", ["嗯。"], read=lambda piece: "嗯", show=lambda piece: "") == ["嗯。"]


def test_timings_without_text_extend_the_cue_before() -> None:
    timings = [
        SentenceTiming(0, "第2课：你好。", 0.0, 1.5),
        SentenceTiming(1, "", 1.5, 3.0),
        SentenceTiming(2, "再见。\n\n下次见", 3.0, 4.25),
    ]
    assert cues(timings) == [(0.0, 3.0, "第2课：你好。"), (3.0, 4.25, "再见。\n下次见")]
    assert to_srt(timings) == (
        "1\n00:00:00,000 --> 00:00:03,000\n第2课：你好。\n\n"
        "2\n00:00:03,000 --> 00:00:04,250\n再见。\n下次见\n"
    )
    assert to_vtt(timings).startswith("WEBVTT\n\n00:00:00.000 --> 00:00:03.000\n第2课：你好。\n\n")


def test_manifest_timings_read_the_recorded_sentences() -> None:
    manifest = {"sentences": [{"index": 0, "text": "第2课", "start_s": 0, "end_s": 1.25}]}
    assert manifest_timings(manifest) == [SentenceTiming(0, "第2课", 0.0, 1.25)]
    assert manifest_timings({}) == [] and manifest_timings({"sentences": None}) == []


def test_the_ui_link_and_the_api_use_the_same_builder() -> None:
    from cosyserve.ui.generate import srt_text

    manifest = {
        "sentences": [
            {"index": 0, "text": "第2课：你好。", "start_s": 0.0, "end_s": 1.0},
            {"index": 1, "text": "", "start_s": 1.0, "end_s": 2.0},
        ]
    }
    assert (
        srt_text(manifest)
        == to_srt(manifest_timings(manifest))
        == ("1\n00:00:00,000 --> 00:00:02,000\n第2课：你好。\n")
    )
    assert srt_text({"sentences": []}) == ""
