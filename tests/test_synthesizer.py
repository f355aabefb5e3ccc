"""The Synthesizer on the demo model: what each mode feeds the LM, voices, streaming, seeds, timings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
import torch
from tests.conftest import PROMPT_TRANSCRIPT

from cosyserve.errors import InputError
from cosyserve.service.local.synthesizer import Synthesizer
from cosyserve.service.requests import SynthesisRequest, VoiceDefaults
from cosyserve.service.stores.voices import VoiceLibrary
from cosyserve.service.subtitles import to_srt, to_vtt

SYSTEM = "You are a helpful assistant."
EOP = "<|endofprompt|>"


@pytest.fixture(scope="module")
def synth(demo_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Synthesizer:
    data = tmp_path_factory.mktemp("data")
    engine = sa.create_engine(f"sqlite:///{data / 'db.sqlite'}")
    synthesizer = Synthesizer.load(demo_model_path, device="cpu")
    synthesizer.voices = VoiceLibrary(
        data / "voices", engine, sa.MetaData(), model_checksum=synthesizer.model_dir.fingerprint
    )
    return synthesizer


class LMSpy:
    """Records what the LM is asked to continue, then lets it run."""

    def __init__(self, synth: Synthesizer, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[dict[str, Any]] = []
        original = synth.engine.lm.generate

        def spy(text_ids, prompt_text_ids=(), prompt_speech_ids=(), **kwargs):
            prefix = kwargs.get("prefix")
            prompt = list(prefix.prompt_text_ids.tolist()) if prefix is not None else list(prompt_text_ids)
            self.calls.append(
                {"text": list(text_ids), "prompt_text": prompt, "speech": list(prompt_speech_ids)}
            )
            return original(text_ids, prompt_text_ids, prompt_speech_ids, **kwargs)

        monkeypatch.setattr(synth.engine.lm, "generate", spy)


def _request(prompt_wav_bytes: bytes, **fields: Any) -> SynthesisRequest:
    base: dict[str, Any] = {"text": "你好，世界。", "prompt_wav": prompt_wav_bytes, "seed": 7}
    base.update(fields)
    return SynthesisRequest(**base)


def test_zero_shot_feeds_transcript_and_prompt_tokens(synth, prompt_wav_bytes, monkeypatch) -> None:
    spy = LMSpy(synth, monkeypatch)
    result = synth.run(_request(prompt_wav_bytes, prompt_text=PROMPT_TRANSCRIPT))
    encode = synth.tokenizer.encode
    (call,) = spy.calls
    assert call["prompt_text"] == encode(SYSTEM + EOP + PROMPT_TRANSCRIPT)
    assert call["text"] == encode("你好，世界。")
    features = synth.analyse_prompt(prompt_wav_bytes)
    assert call["speech"] == features.speech_token[0].tolist() and len(call["speech"]) > 50
    assert result.seed == 7 and result.audio.dtype == np.float32
    assert (
        len(result.audio) == result.speech_tokens * 2 * 480
    )  # 25 Hz tokens, 50 Hz mel, 480 samples per frame


def test_cross_lingual_puts_system_prefix_on_every_segment(synth, prompt_wav_bytes, monkeypatch) -> None:
    spy = LMSpy(synth, monkeypatch)
    text = "第一句话说得很长很长，要让它超过一个片段的长度才行。" * 4 + "第二句。"
    synth.run(_request(prompt_wav_bytes, text=text))
    assert len(spy.calls) >= 2
    for call in spy.calls:
        assert call["prompt_text"] == [] and call["speech"] == []
        assert call["text"][: len(synth.tokenizer.encode(SYSTEM + EOP))] == synth.tokenizer.encode(
            SYSTEM + EOP
        )
        assert call["text"].count(synth.tokenizer.endofprompt_id) == 1


def test_instruct_replaces_transcript(synth, prompt_wav_bytes, monkeypatch) -> None:
    spy = LMSpy(synth, monkeypatch)
    synth.run(_request(prompt_wav_bytes, instruct="请用四川话表达。", prompt_text=PROMPT_TRANSCRIPT))
    (call,) = spy.calls
    assert call["prompt_text"] == synth.tokenizer.encode(f"{SYSTEM} 请用四川话表达。{EOP}")
    assert call["speech"] == []


def test_user_typed_markers_are_not_doubled(synth, prompt_wav_bytes, monkeypatch) -> None:
    spy = LMSpy(synth, monkeypatch)
    synth.run(_request(prompt_wav_bytes, prompt_text=SYSTEM + EOP + PROMPT_TRANSCRIPT))
    (call,) = spy.calls
    assert call["prompt_text"].count(synth.tokenizer.endofprompt_id) == 1


def test_same_seed_same_audio_and_seed_reported(synth, prompt_wav_bytes) -> None:
    first = synth.run(_request(prompt_wav_bytes, prompt_text=PROMPT_TRANSCRIPT, seed=11))
    second = synth.run(_request(prompt_wav_bytes, prompt_text=PROMPT_TRANSCRIPT, seed=11))
    assert np.array_equal(first.audio, second.audio)
    drawn = synth.run(_request(prompt_wav_bytes, prompt_text=PROMPT_TRANSCRIPT, seed=None))
    assert 0 <= drawn.seed < 2**31


def test_streaming_concatenates_to_one_shot_length(synth, prompt_wav_bytes) -> None:
    text = "今天天气很好，我们一起去公园散步吧。"
    one_shot = synth.run(_request(prompt_wav_bytes, text=text, prompt_text=PROMPT_TRANSCRIPT, seed=3))
    stream = synth.synthesize(
        _request(prompt_wav_bytes, text=text, prompt_text=PROMPT_TRANSCRIPT, seed=3, stream=True)
    )
    chunks = [chunk.samples for chunk in stream]
    result = stream.result()
    assert result.speech_tokens == one_shot.speech_tokens
    if result.speech_tokens >= 28:
        assert len(chunks) >= 2  # audio arrives before the sentence is finished
    assert sum(len(c) for c in chunks) == len(one_shot.audio)


def test_sentence_timings_and_subtitles(synth, prompt_wav_bytes) -> None:
    text = "第一句话说得很长很长，要让它超过一个片段的长度才行。" * 4 + "最后一句。"
    progress = []
    stream = synth.synthesize(_request(prompt_wav_bytes, text=text), progress=progress.append)
    result = stream.result()
    assert len(result.timings) >= 2 and result.timings[0].start_s == 0.0
    assert result.timings[-1].end_s == pytest.approx(result.duration_s)
    assert all(a.end_s == b.start_s for a, b in zip(result.timings, result.timings[1:], strict=False))
    assert progress[-1].segments_done == progress[-1].segments_total == len(result.timings)
    assert to_srt(result.timings).startswith("1\n00:00:00,000 --> ")
    assert to_vtt(result.timings).startswith("WEBVTT\n\n00:00:00.000 --> ")


def test_subtitles_show_the_typed_text_per_sentence(synth, prompt_wav_bytes) -> None:
    """Issue 29: the SRT shows `第2课` (typed), not `第二课` (read), at the spoken segments' times."""
    result = synth.synthesize(_request(prompt_wav_bytes, text="第2课：你好")).result()
    srt = to_srt(result.timings)
    assert "第2课：你好" in srt and "第二课" not in srt
    assert result.reading["spoken"] == ["第二课：你好。"]
    sentence = "第2课的内容很长很长，我们要学习很多很多的东西，包括2本书和12个生字，一共需要¥12.50的费用。"
    long_text = sentence * 3 + "最后一句说2遍。"  # two segments of whole sentences
    result = synth.synthesize(_request(prompt_wav_bytes, text=long_text, seed=3)).result()
    assert [t.text for t in result.timings] == [sentence * 2, sentence + "最后一句说2遍。"]
    assert "两遍" in result.reading["spoken"][-1]
    blocks = to_srt(result.timings).split("\n\n")
    assert [block.splitlines()[2] for block in blocks] == [sentence * 2, sentence + "最后一句说2遍。"]
    assert blocks[1].splitlines()[1].split(" --> ")[0] == blocks[0].splitlines()[1].split(" --> ")[1]


def test_volume_and_speed(synth, prompt_wav_bytes) -> None:
    base = synth.run(_request(prompt_wav_bytes, prompt_text=PROMPT_TRANSCRIPT, seed=5))
    quiet = synth.run(_request(prompt_wav_bytes, prompt_text=PROMPT_TRANSCRIPT, seed=5, volume=0.5))
    np.testing.assert_allclose(quiet.audio, np.clip(base.audio, -1, 1) * 0.5, atol=1e-6)
    fast = synth.run(_request(prompt_wav_bytes, prompt_text=PROMPT_TRANSCRIPT, seed=5, speed=2.0))
    assert len(fast.audio) == int(base.speech_tokens * 2 / 2.0) * 480


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt_wav": None}, "exactly one of"),
        ({"voice": "nobody"}, "exactly one of"),
        ({"prompt_wav": b"not audio"}, "decode|read|audio"),
        ({"text": "字" * 201}, "limit is 200"),
        ({"speed": 5.0}, "speed"),
        ({"volume": -1.0}, "volume"),
        ({"seed": -3}, "seed"),
        ({"text": "[h][xyz]"}, "xyz"),
    ],
)
def test_bad_requests_are_input_errors(synth, prompt_wav_bytes, fields, message) -> None:
    with pytest.raises(InputError, match=message):
        synth.synthesize(_request(prompt_wav_bytes, **fields))


def test_voice_library_round_trip(synth, prompt_wav_bytes, monkeypatch) -> None:
    voice = synth.add_voice(
        "小明",
        prompt_wav_bytes,
        PROMPT_TRANSCRIPT,
        defaults=VoiceDefaults(seed=9, speed=1.0),
        lexicon={"重庆": "chóng qìng"},
    )
    assert voice.report["duration_s"] > 3 and [v.name for v in synth.voices.list()] == ["小明"]
    with pytest.raises(InputError, match="already have a voice named"):
        synth.add_voice("小明", prompt_wav_bytes)
    calls = []
    monkeypatch.setattr(synth, "analyse_prompt", lambda audio: calls.append(audio))  # must not be needed
    spy = LMSpy(synth, monkeypatch)
    by_voice = synth.run(SynthesisRequest(text="你好，世界。", voice="小明"))
    assert by_voice.seed == 9 and not calls
    assert spy.calls[0]["prompt_text"] == synth.tokenizer.encode(SYSTEM + EOP + PROMPT_TRANSCRIPT)
    renamed = synth.voices.update("小明", name="xiaoming")
    assert synth.voices.get(voice.id).name == renamed.name == "xiaoming"
    synth.voices.delete("xiaoming")
    with pytest.raises(InputError, match="no voice"):
        synth.synthesize(SynthesisRequest(text="你好。", voice="xiaoming"))


def test_voice_lexicon_applies(synth, prompt_wav_bytes, monkeypatch) -> None:
    synth.add_voice("lex", prompt_wav_bytes, PROMPT_TRANSCRIPT, lexicon={"重庆": "chóng qìng"})
    spy = LMSpy(synth, monkeypatch)
    synth.run(SynthesisRequest(text="我在重庆。", voice="lex", seed=1))
    assert spy.calls[0]["text"] == synth.tokenizer.encode("我在[ch][óng][q][ìng]。")
    synth.voices.delete("lex")


def test_the_server_lexicon_applies_and_a_voices_entries_win(synth, prompt_wav_bytes, monkeypatch) -> None:
    synth.add_voice("lex2", prompt_wav_bytes, PROMPT_TRANSCRIPT, lexicon={"重庆": "zhòng qìng"})
    monkeypatch.setattr(synth, "lexicon", {"重庆": "chóng qìng", "行长": "háng zhǎng"})  # `--lexicon FILE`
    spy = LMSpy(synth, monkeypatch)
    synth.run(SynthesisRequest(text="重庆行长。", seed=1, prompt_wav=prompt_wav_bytes, prompt_text="你好。"))
    synth.run(SynthesisRequest(text="重庆行长。", voice="lex2", seed=1))
    assert spy.calls[0]["text"][-10:] == synth.tokenizer.encode("[ch][óng][q][ìng][h][áng][zh][ǎng]。")[-10:]
    assert spy.calls[1]["text"] == synth.tokenizer.encode("[zh][òng][q][ìng][h][áng][zh][ǎng]。")
    synth.voices.delete("lex2")


def test_saved_voice_streaming_reuses_prompt_cache(synth, prompt_wav_bytes, monkeypatch) -> None:
    """A saved voice streams from its cached prompt keys/values and gives an upload's tokens and mels.

    The two paths agree where they are meant to: the same speech tokens, chunk lengths and mels up to
    float rounding (they reduce in different orders: max 1.2e-6 measured with AVX2 kernels, 0 on
    AVX-512). The waveforms are not compared sample by sample: the vocoder's harmonic phase is a running
    sum of F0 over the whole utterance, so 1e-6 in the mel becomes a phase drift that grows chunk by
    chunk (max 3.2e-3 at the third chunk with AVX2 kernels)."""
    mels: list[torch.Tensor] = []
    token2wav = synth.engine.token2wav
    emit = token2wav._emit

    def recording_emit(state, new_mel, finalize):
        mels.append(new_mel.clone())
        return emit(state, new_mel, finalize)

    monkeypatch.setattr(token2wav, "_emit", recording_emit)
    synth.add_voice("cached", prompt_wav_bytes, PROMPT_TRANSCRIPT)
    text = "今天天气很好，我们一起去公园散步吧。"
    uploaded = synth.synthesize(
        _request(prompt_wav_bytes, text=text, prompt_text=PROMPT_TRANSCRIPT, seed=4, stream=True)
    )
    by_upload = [c.samples for c in uploaded]
    upload_mels, mels[:] = list(mels), []
    by_voice = [
        c.samples for c in synth.synthesize(SynthesisRequest(text=text, voice="cached", seed=4, stream=True))
    ]
    assert "cached" not in synth._flow_caches and len(synth._flow_caches) == 1  # keyed by voice id
    assert [len(c) for c in by_voice] == [len(c) for c in by_upload] and len(by_voice) >= 2
    assert [m.shape for m in mels] == [m.shape for m in upload_mels]
    for voice_mel, upload_mel in zip(mels, upload_mels, strict=True):
        torch.testing.assert_close(voice_mel, upload_mel, atol=1e-4, rtol=0)
    synth.voices.delete("cached")


def test_the_result_reports_what_the_model_read(synth, prompt_wav_bytes) -> None:
    result = synth.run(
        _request(prompt_wav_bytes, text="我有3个苹果。Hello, world.", prompt_text=PROMPT_TRANSCRIPT)
    )
    reading = result.reading
    assert reading["mode"] == "zero_shot" and reading["instruction"] is None
    assert "三" in "".join(reading["spoken"]) and "3" not in "".join(reading["spoken"])
    assert len(reading["lm_tokens"]) == len(reading["lm_text"]) == len(result.timings)
    for text, pieces in zip(reading["lm_text"], reading["lm_tokens"], strict=True):
        assert "".join(pieces) == text  # the token pieces spell the LM's text exactly
