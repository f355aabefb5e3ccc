"""Batches and dubbing without a model: subtitle files, batch files, and where a dub's cues go."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from cosyserve.errors import InputError
from cosyserve.frontend.subtitles import parse_subtitles
from cosyserve.service.batches.dub_plan import CueSlot, planned_track_seconds
from cosyserve.service.batches.dub_timeline import audible_span, fit_speed, place
from cosyserve.service.batches.dub_track import write_track
from cosyserve.service.batches.inputs import BatchRules, cue_items, items_from, kind_of, read_items
from cosyserve.service.batches.items import BatchPrompt, ItemParams, item_request

RATE = 24000
RULES = BatchRules(max_items=5, max_text_chars=20, shared={"voice": "alice", "seed": 3})


def test_srt_is_read_leniently_where_players_are() -> None:
    srt = (
        "\ufeff2\r\n00:00:04,500 --> 00:00:06,000\r\n<i>second</i> {\\an8}line\r\n\r\n"
        "1\r\n00:00:01.000 --> 00:00:03,250 X1:10\r\nfirst\r\nand more\r\n\r\n"
        "00:00:07,000 --> 00:00:08,000\r\n♪♪\r\n"
    )
    cues = parse_subtitles(srt.encode("utf-8"))
    assert [(c.index, c.start_s, c.end_s, c.text) for c in cues] == [
        (1, 1.0, 3.25, "first and more"),
        (2, 4.5, 6.0, "second line"),
        (3, 7.0, 8.0, "♪♪"),
    ]
    # time order, each cue keeping the file's number (or its place in the file when it has none)
    assert [(c.cue_id, c.file_position) for c in cues] == [("1", 2), ("2", 1), ("3", 3)]


def test_cue_numbers_without_blank_lines_are_not_spoken() -> None:
    """`Good morning 2` was read out when a file left out the blank lines between its cues."""
    srt = (
        "1\n00:00:01,000 --> 00:00:02,000\nGood morning\n2\n00:00:03,000 --> 00:00:04,000\nGood night\n3\n"
        "00:00:05,000 --> 00:00:06,000\nRoom 101\nBye"
    )
    cues = parse_subtitles(srt)
    assert [(c.text, c.cue_id) for c in cues] == [
        ("Good morning", "1"),
        ("Good night", "2"),
        ("Room 101 Bye", "3"),
    ]


def test_webvtt_notes_settings_and_short_times() -> None:
    vtt = (
        "WEBVTT - episode 1\n\nNOTE a comment\nthat spans lines\n\nSTYLE\n::cue { color: red }\n\n"
        "intro\n00:01.000 --> 00:02.500 align:start position:10%\n<v Alice>Hello <b>there</b>.\n\n"
        "01:00:00.000 --> 01:00:01.000\nlate\n"
    )
    cues = parse_subtitles(vtt)
    assert [(c.start_s, c.end_s, c.text) for c in cues] == [
        (1.0, 2.5, "Hello there."),
        (3600.0, 3601.0, "late"),
    ]
    assert [(c.cue_id, c.file_position) for c in cues] == [("intro", 1), ("2", 2)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "1\n00:00:01,000 --> 00:00:0x,000\nhi\n",
            "line 2: '00:00:01,000 --> 00:00:0x,000' is not a time range",
        ),
        ("1\n00:00:03,000 --> 00:00:02,000\nhi\n", "line 2: the cue ends (00:00:02,000) before it starts"),
        ("1\n00:00:01,000 --> 00:00:01,000\nhi\n", "line 2: the cue has no length"),
        ("just some text\n", "has no cues"),
        (
            "00:00:01,000 --> 00:00:02,000\na\n\n00:00:01,000 --> 00:00:03,000\nb\n",
            "two cues start at 00:00:01.000",
        ),
        (b"\xff\xfe\x00\xd8", "not UTF-8"),
    ],
)
def test_subtitles_that_would_misplace_speech_are_refused(text, message) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_subtitles(text, what="episode.srt")


def test_csv_items_with_shared_settings_and_problems() -> None:
    data = (
        "Text, Name ,seed,speed,format\n"
        "hello.,greeting,,,\n"
        "hi again.,a/b c,7,1.5,mp3\n"
        ",empty,,,\n"
        "this text is far too long to say,,,,\n"
        "。。。,,,,\n"
        "x.,,x,,\n"
        "y.,,,9,\n"
        "z.,,,,ogg\n"
    ).encode()
    with pytest.raises(InputError, match="8 items, the limit is 5"):
        read_items(data, "csv", RULES)
    items = read_items(data, "csv", BatchRules(10, 20, shared={"voice": "alice", "seed": 3}))
    first, second = items[0], items[1]
    assert (first.name, first.params["seed"], first.params["voice"], first.params["format"]) == (
        "greeting",
        3,
        "alice",
        "wav",
    )
    assert (second.name, second.params["seed"], second.params["speed"], second.params["format"]) == (
        "a_b_c",
        7,
        1.5,
        "mp3",
    )
    problems = [item.problem for item in items]
    assert problems[:2] == [None, None]
    assert "no text" in problems[2] and "limit is 20" in problems[3] and "nothing to speak" in problems[4]
    assert (
        "not a number" in problems[5]
        and "out of range" in problems[6]
        and "'ogg' is not one of" in problems[7]
    )
    assert items[3].name == "this_text_is_far_too_lon"  # from its text: letters, digits, _ and -


def test_takes_and_thresholds_per_item_over_the_batchs() -> None:
    """An item's `takes` and `thresholds` (a CSV cell holds the JSON text) win over the batch's; each
    threshold it leaves out is the batch's; wrong ones make that item fail alone, named."""
    shared = {"voice": "alice", "takes": 2, "thresholds": {"min_similarity": 0.6, "max_pause_s": 3.0}}
    rules = BatchRules(10, 100, shared=shared)
    data = (
        b"text,takes,thresholds\n"
        b"one.,,\n"
        b'two.,4,"{""min_similarity"": 0.2}"\n'
        b"three.,9,\n"
        b'four.,,"{""loudness"": 1}"\n'
        b"five.,,not json\n"
    )
    items = read_items(data, "csv", rules)
    one, two = ItemParams.of(items[0].params), ItemParams.of(items[1].params)
    assert (one.takes, one.thresholds) == (2, {"min_similarity": 0.6, "max_pause_s": 3.0})
    assert (two.takes, two.thresholds) == (4, {"min_similarity": 0.2, "max_pause_s": 3.0})
    request = item_request(two, BatchPrompt())
    assert request.takes == 4 and request.thresholds == two.thresholds
    problems = [item.problem for item in items]
    assert problems[:2] == [None, None] and "takes '9' is out of range" in problems[2]
    assert "unknown quality threshold 'loudness'" in problems[3] and "not a JSON object" in problems[4]
    assert items[2].params["takes"] is None  # a failed item keeps only what views can show
    bare = ItemParams.of(items_from([{"text": "hi.", "voice": "bob"}], BatchRules(10, 100)).pop().params)
    assert (bare.takes, bare.thresholds) == (None, None)  # the server's


def test_json_jsonl_and_text_items() -> None:
    json_items = read_items(b'{"items": ["one.", {"text": "two.", "colour": "red"}]}', "json", RULES)
    assert [i.problem for i in json_items] == [None, "unknown field 'colour': items have text, voice, "
                                                "instruct, seed, speed, volume, format, takes, "
                                                "thresholds, name"]  # fmt: skip
    lines = read_items(b'{"text": "a."}\nnot json\n\n"b."\n', "jsonl", RULES)
    assert [i.problem for i in lines] == [None, "line 2 is not valid JSON", None]
    text = read_items(b"first.\n\n second. \n", "txt", RULES)
    assert [i.params["text"] for i in text] == ["first.", "second."]
    assert items_from(["x."], BatchRules(shared={}))[0].problem.startswith("no voice")
    assert items_from(["x."], BatchRules(has_prompt=True))[0].problem is None
    with pytest.raises(InputError, match="no items"):
        items_from([], RULES)
    with pytest.raises(InputError, match="header row with a `text` column"):
        read_items(b"words\nhi\n", "csv", RULES)
    assert (kind_of("a.CSV"), kind_of(None, "application/x-ndjson"), kind_of("b.txt")) == (
        "csv",
        "jsonl",
        "txt",
    )
    with pytest.raises(InputError, match="can't tell"):
        kind_of("a.xlsx")


def test_cue_items_must_stop_at_the_next_cue() -> None:
    cues = parse_subtitles("00:01.000 --> 00:02.000\na.\n\n00:02.500 --> 00:04.000\nb.\n")
    items = cue_items(cues, RULES)
    assert [(i.name, i.params["start_s"], i.params["end_s"], i.params["limit_s"]) for i in items] == [
        ("cue1", 1.0, 2.0, 2.5),
        ("cue2", 2.5, 4.0, 4.0),
    ]


def test_a_dubs_track_is_planned_limited_and_shared_out_at_submit() -> None:
    srt = (
        "10\n00:00:05,000 --> 00:00:09,000\nb.\n\n"  # ends after the last cue starts: the track ends here
        "4\n00:00:01,000 --> 00:00:02,000\na.\n\n"
        "11\n00:00:06,000 --> 00:00:07,000\nc.\n"
    )
    cues = parse_subtitles(srt)
    assert planned_track_seconds(cues) == 9.0
    items = cue_items(cues, BatchRules(5, 20, shared={"voice": "alice"}, max_track_s=9.0))
    shares = [i.params["share_s"] for i in items]
    assert shares == [5.0, 1.0, 3.0] and sum(shares) == 9.0  # 0-5, 5-6, 6-9: the whole track, once
    named = [(i.params["cue_id"], i.params["file_position"]) for i in items]
    assert named == [("4", 2), ("10", 1), ("11", 3)]
    with pytest.raises(InputError) as refused:
        cue_items(cues, BatchRules(5, 20, shared={"voice": "alice"}, max_track_s=8.5))
    message = str(refused.value)
    assert "would be 0:00:09 long" in message and "limit of 0:00:08.500" in message
    assert "max_dub_track_s" in message and "--max-dub-track-s" in message


def noise(seconds: float, lead: float = 0.0, tail: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(0)
    body = (0.05 * rng.standard_normal(int(seconds * RATE))).astype(np.float32)
    return np.concatenate(
        [np.zeros(int(lead * RATE), np.float32), body, np.zeros(int(tail * RATE), np.float32)]
    )


def test_near_silence_around_speech_is_trimmed() -> None:
    first, last = audible_span(noise(1.0, lead=0.2, tail=0.3), RATE)
    assert abs(first / RATE - 0.198) < 0.003 and abs(last / RATE - 1.22) < 0.003
    assert audible_span(np.zeros(RATE, np.float32), RATE) == (0, 0)
    first, _ = audible_span(noise(1.0, lead=2.0), RATE)
    assert first == int(0.5 * RATE)  # at most half a second: a long pause is the speaker's


def test_fit_speed_stays_within_its_limit() -> None:
    assert fit_speed(1.0, 2.0, 1.0, 1.25) == 1.0
    assert fit_speed(2.2, 2.0, 1.0, 1.25) == pytest.approx(1.1 * 1.01)
    assert fit_speed(5.0, 2.0, 1.0, 1.25) == 1.25
    assert fit_speed(5.0, 2.0, 1.5, 1.25) == 1.5  # never slower than asked


def test_place_overflows_into_the_gap_and_is_cut_before_the_next_cue(tmp_path) -> None:
    start, clip, placed = place(noise(1.5), RATE, 1.0, 2.0, 3.0)  # 0.5 s past its end, within the gap
    assert start == RATE and len(clip) == int(1.5 * RATE)
    assert (placed.overflow_s, placed.cut_s, placed.actual_end_s) == (0.5, 0.0, 2.5)
    start, clip, placed = place(noise(3.0), RATE, 1.0, 2.0, 3.0)  # would run over the next cue at 3.0
    # 3 s of speech: 2 s played (1 s of it past the cue's end), 1 s cut and never played
    assert len(clip) == 2 * RATE
    assert (placed.speech_s, placed.played_s, placed.overflow_s, placed.cut_s) == (3.0, 2.0, 1.0, 1.0)
    assert abs(clip[-1]) < 1e-6 and np.max(np.abs(clip[-10:])) < 0.01  # faded out, no click
    path = tmp_path / "track.wav"
    cues = [(CueSlot(1.0, 2.0, 3.0), lambda: noise(3.0)), (CueSlot(3.0, 4.0, 4.0), lambda: None)]
    placements = write_track(path, cues, 4.0, RATE)
    track, rate = sf.read(path, dtype="float32")
    assert rate == RATE and len(track) == 4 * RATE and placements[1] is None
    assert np.all(track[: RATE - 1] == 0) and np.all(track[3 * RATE :] == 0)
    np.testing.assert_allclose(track[RATE : 3 * RATE - 300], noise(3.0)[: 2 * RATE - 300], atol=1e-4)


def test_a_batch_cloned_from_a_recording_with_its_transcript_is_logged_zero_shot() -> None:
    """The activity log said cross_lingual while the items' manifests said zero_shot (a team's run)."""
    from cosyserve.service.activity import request_mode
    from cosyserve.service.batches.items import batch_request
    from cosyserve.service.requests import OutputSpec

    items = [{"text": "第一句。"}, {"text": "第二句。"}]
    assert (
        request_mode(batch_request({"prompt_text": "希望你以后能够做的比我还好呦。"}, items), OutputSpec())
        == "zero_shot"
    )
    assert request_mode(batch_request({}, items), OutputSpec()) == "cross_lingual"
