"""A text of only invisible characters (zero-width spaces and joiners, byte-order marks, word joiners,
direction marks, control characters) is an empty text on every path that takes one: a request, a job, a
batch item, OpenAI's speech endpoint. Refused with a 400 that names the problem, never synthesised."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.conftest import enrol_voice

from cosyserve.errors import InputError
from cosyserve.frontend.text import prepare_texts
from cosyserve.frontend.text.split import has_content, require_visible_text
from cosyserve.frontend.tokenizer import TextTokenizer
from cosyserve.service.backend import job_pieces
from cosyserve.service.batches.inputs import BatchRules, items_from
from cosyserve.service.requests import SynthesisRequest

INVISIBLE = [
    "\u200b",  # zero-width space
    "\u200b\u200c\u200d\ufeff\u2060",  # with the non-joiner, joiner, byte-order mark, word joiner
    " \u200b\n\u200e\u200f ",  # between blanks, with the direction marks
    "\u00ad\u2061\u180e",  # soft hyphen, function application, Mongolian vowel separator
    "\u0000",  # NUL: it was read as "." and charged
    "\u0001\u007f\u0000 ",  # other control characters
]


@pytest.mark.parametrize("text", INVISIBLE)
def test_invisible_text_is_empty_and_says_so(text: str) -> None:
    with pytest.raises(InputError, match="the text is empty: it holds only invisible characters"):
        require_visible_text(text)
    assert not has_content(text)


def test_visible_text_with_invisible_characters_in_it_passes() -> None:
    for text in ("a\u200bb", "\ufeff你好", "hi\u2060!"):
        require_visible_text(text)
        assert has_content(text)
    with pytest.raises(InputError, match="the text is empty: give the words"):
        require_visible_text(" \n")


@pytest.mark.parametrize("text", INVISIBLE)
def test_every_text_check_refuses_it(tiny_dir: Path, text: str) -> None:
    tokenizer = TextTokenizer.from_dir(tiny_dir / "model")
    with pytest.raises(InputError, match="invisible characters"):
        prepare_texts(text, tokenizer=tokenizer)
    with pytest.raises(InputError, match="invisible characters"):
        prepare_texts(f"用欢快的语气说<|endofprompt|>{text}", tokenizer=tokenizer)
    with pytest.raises(InputError, match="invisible characters"):
        job_pieces(SynthesisRequest(text=text, voice="alice"), 200)
    (item,) = items_from([{"text": text}], BatchRules(shared={"voice": "alice"}))
    assert item.problem is not None and "invisible characters" in item.problem


@pytest.fixture(scope="module")
def client(start_api_server, prompt_wav_bytes):
    live = start_api_server()
    with live.client() as client:
        enrol_voice(client, "alice", prompt_wav_bytes)
        yield client
    live.stop()


def test_the_api_answers_400_naming_the_problem(client) -> None:
    text = "\u200b\u200c\u200d\ufeff\u2060"
    for path, body in (
        ("/v1/tts", {"text": text, "voice": "alice"}),
        ("/v1/tts", {"text": text, "voice": "alice", "stream": True}),
        ("/v1/jobs", {"text": text, "voice": "alice"}),
        ("/v1/audio/speech", {"model": "tts-1", "input": text, "voice": "alice"}),
    ):
        response = client.post(path, json=body)
        assert response.status_code == 400, (path, response.text)
        error = response.json()["error"]
        assert error["code"] == "invalid_input" and "invisible characters" in error["message"], path
    batch = client.post("/v1/batches", json={"voice": "alice", "items": [text, "hi."]})
    assert batch.status_code == 202
    items = batch.json().get("items") or []
    problems = [item for item in items if item.get("error")]
    assert problems and "invisible characters" in problems[0]["error"]["message"]


def test_invisible_characters_inside_a_text_are_not_read(tiny_dir: Path) -> None:
    """Control and format characters inside a visible text reached the LM as tokens of their own."""
    tokenizer = TextTokenizer.from_dir(tiny_dir / "model")
    prepared = prepare_texts(
        "你好\x01\x07世界\x1b\u202e\u200f！",
        tokenizer=tokenizer,
        prompt_text="希望\x00你以后能够做的比我还好呦。",
    )
    assert prepared.segments == ["你好世界！"] and prepared.written_segments == ["你好世界！"]
    assert "\x00" not in prepared.lm_prompt_text
    emoji = prepare_texts("家人👨\u200d👩\u200d👧好。", tokenizer=tokenizer)
    assert "\u200d" in emoji.segments[0]  # the joiner of an emoji sequence stays


def test_an_inline_instruction_has_the_instruct_limit(tiny_dir: Path) -> None:
    tokenizer = TextTokenizer.from_dir(tiny_dir / "model")
    with pytest.raises(InputError, match="at most 500 are allowed"):
        prepare_texts("说" * 501 + "<|endofprompt|>你好。", tokenizer=tokenizer)


def test_a_job_text_is_counted_as_a_request_text_is() -> None:
    """Composed and unpadded: 5001 "é" written decomposed were 10002 characters to a job, 5001 to /v1/tts."""
    from cosyserve.service.backend import JOB_TEXT_FACTOR

    limit = 20 * JOB_TEXT_FACTOR
    decomposed = "e\u0301" * limit
    assert "".join(job_pieces(SynthesisRequest(text=decomposed + "\n", voice="alice"), 20)) == "é" * limit
    with pytest.raises(InputError, match=f"at most {limit} characters, got {limit + 1}"):
        job_pieces(SynthesisRequest(text=decomposed + "e\u0301", voice="alice"), 20)


def test_a_jobs_inline_instruction_holds_for_every_piece_and_has_its_limit() -> None:
    """Cut with the text, it went to the first piece only, and a 600-character one was taken."""
    text = "用悲伤的语气说<|endofprompt|>" + "今天天气很好，我们去公园。" * 40
    pieces = job_pieces(SynthesisRequest(text=text, voice="alice"), 200)
    assert len(pieces) > 1 and all(piece.startswith("用悲伤的语气说。<|endofprompt|>") for piece in pieces)
    with pytest.raises(InputError, match="at most 500 are allowed"):
        job_pieces(SynthesisRequest(text="说" * 600 + "<|endofprompt|>" + "你好。" * 100, voice="alice"), 200)
