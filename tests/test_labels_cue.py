"""The explicit label: the short-long-short-short cue starts every output (found by correlation in the
decoded audio of each format, whole and streamed), and sentence timings move with it."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile

from cosyserve.service.audio_formats import StreamEncoder, encode
from cosyserve.service.labels import cue
from cosyserve.service.labels.labeller import OPT_OUT, Labeller
from cosyserve.service.outcomes import SentenceTiming, SynthesisResult
from cosyserve.service.requests import SynthesisRequest
from cosyserve.service.subtitles import to_srt, to_vtt

RATE = 24000
FORMATS = ("wav", "mp3", "flac", "opus", "pcm")


def speech(seconds: float = 1.0, rate: int = RATE) -> np.ndarray:
    noise = np.random.default_rng(0).standard_normal(int(seconds * rate))
    return (0.1 * noise).astype(np.float32)


def decode(data: bytes, fmt: str, rate: int = RATE) -> np.ndarray:
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32767
    return soundfile.read(io.BytesIO(data), dtype="float32")[0]


def with_flac_length(data: bytes, samples: int) -> bytes:
    """A streamed FLAC with its STREAMINFO's total sample count (36 bits from body byte 13) filled in."""
    info = bytearray(data)
    info[8 + 13] = (info[8 + 13] & 0xF0) | (samples >> 32)
    info[8 + 14 : 8 + 18] = (samples & 0xFFFFFFFF).to_bytes(4, "big")
    return bytes(info)


def cue_correlation(audio: np.ndarray, rate: int = RATE, at_s: float = 0.0, search_s: float = 0.06) -> float:
    """The best normalised correlation of the cue's tones with `audio` near `at_s` (codec delays)."""
    tones = cue.cue_samples(rate)[: round((cue.cue_seconds(rate) - cue.PAUSE_S) * rate)]
    start = round(at_s * rate)
    best = 0.0
    for lag in range(max(0, start - round(search_s * rate)), start + round(search_s * rate)):
        piece = audio[lag : lag + len(tones)]
        if len(piece) < len(tones):
            break
        norm = np.linalg.norm(piece) * np.linalg.norm(tones)
        best = max(best, float(np.dot(piece, tones) / norm) if norm else 0.0)
    return best


class FakeSynthesizer:
    """What `Labeller.explicit_for` asks of a Synthesizer; each text is spoken as its own tone."""

    sample_rate = RATE

    def __init__(self) -> None:
        self.model_dir = type("ModelDir", (), {"fingerprint": "model-1"})()
        self.requests: list[SynthesisRequest] = []

    def synthesize(self, request: SynthesisRequest, **kwargs: object):
        self.requests.append(request)
        t = np.arange(RATE // 2) / RATE
        audio = (0.2 * np.sin(2 * np.pi * (300 + len(request.text)) * t)).astype(np.float32)
        return type("Stream", (), {"result": lambda self: SynthesisResult(audio, RATE, 0)})()


def explicit(mode: str, kind: str = "cue", extra: dict | None = None, synth=None, text: str = "Hi."):
    labeller = Labeller(provider="p", secret=b"s", explicit=mode, explicit_kind=kind)
    return labeller.explicit_for(synth or FakeSynthesizer(), SynthesisRequest(text, voice="v"), extra or {})


def result(seconds: float = 1.0) -> SynthesisResult:
    timings = [SentenceTiming(0, "Hello.", 0.0, 0.4), SentenceTiming(1, "World.", 0.4, seconds)]
    return SynthesisResult(audio=speech(seconds), sample_rate=RATE, seed=1, timings=timings)


def test_the_cue_is_short_long_short_short() -> None:
    samples = cue.cue_samples(RATE)
    loud = np.convolve(np.abs(samples), np.ones(64) / 64, "same") > 0.05  # the tones' envelope
    edges = np.flatnonzero(np.diff(loud.astype(int)))
    starts, ends = edges[::2], edges[1::2]
    lengths = (ends - starts) / RATE
    assert len(lengths) == 4
    assert (
        lengths[1] > 2.5 * lengths[0]
        and abs(lengths[0] - lengths[2]) < 0.01
        and abs(lengths[2] - lengths[3]) < 0.01
    )
    assert 0.5 < cue.cue_seconds(RATE) < 1.2  # a short cue, under a second and a bit
    assert cue_correlation(speech()) < 0.2  # speech alone does not look like it


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_starts_with_the_cue(fmt: str) -> None:
    delivered = Labeller.with_explicit(result(), explicit("start"))
    data = encode(delivered.audio, fmt, source_rate=RATE)
    audio = decode(data, fmt)
    assert cue_correlation(audio) > 0.9
    plain = decode(encode(result().audio, fmt, source_rate=RATE), fmt)
    assert cue_correlation(plain) < 0.2


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_streamed_format_starts_with_the_cue(fmt: str) -> None:
    labeller = Labeller(provider="p", secret=b"s", explicit="start_and_end")
    encoder = labeller.stream_encoder(StreamEncoder(fmt, source_rate=RATE), "req", explicit("start_and_end"))
    audio = speech(1.0)
    parts = [encoder.header()] + [encoder.encode(audio[i : i + 4800]) for i in range(0, len(audio), 4800)]
    data = b"".join([*parts, encoder.finish()])
    end_at = cue.cue_seconds(RATE) + 1.0 + cue.PAUSE_S
    if fmt == "flac":  # a stream's STREAMINFO says "length unknown", which libsndfile can't read
        data = with_flac_length(data, round((end_at + cue.cue_seconds(RATE)) * RATE))
    decoded = decode(data, fmt)
    assert cue_correlation(decoded) > 0.9
    assert cue_correlation(decoded, at_s=end_at) > 0.9  # and after the speech


def test_resampled_output_still_starts_with_the_cue() -> None:
    delivered = Labeller.with_explicit(result(), explicit("start"))
    data = encode(delivered.audio, "mp3", source_rate=RATE, sample_rate=44100)
    assert cue_correlation(decode(data, "mp3"), rate=44100) > 0.9


def test_timings_and_subtitles_move_by_the_cue() -> None:
    shift = cue.cue_seconds(RATE)
    delivered = Labeller.with_explicit(result(1.0), explicit("start_and_end"))
    assert [t.start_s for t in delivered.timings] == [round(shift, 3), round(0.4 + shift, 3)]
    assert delivered.duration_s == pytest.approx(1.0 + 2 * shift + cue.PAUSE_S, abs=1e-3)
    srt, vtt = to_srt(delivered.timings), to_vtt(delivered.timings)
    first = f"00:00:00,{round(shift * 1000):03d} --> 00:00:01,{round((0.4 + shift) * 1000) - 1000:03d}"
    assert first in srt and first.replace(",", ".") in vtt


def test_off_and_the_admin_opt_out_leave_the_audio_alone() -> None:
    original = result()
    assert explicit("off") is None and explicit("start", extra={OPT_OUT: False}) is None
    assert Labeller.with_explicit(original, None) is original
    stream = Labeller(provider="p", secret=b"s").stream_encoder(StreamEncoder("pcm"), "req", None)
    assert stream.header() == b""


def test_the_spoken_notice_is_made_once_per_voice_and_language() -> None:
    synth = FakeSynthesizer()
    labeller = Labeller(provider="p", secret=b"s", explicit="start_and_end", explicit_kind="notice")
    first = labeller.explicit_for(synth, SynthesisRequest("你好。", voice="alice"), {})
    again = labeller.explicit_for(synth, SynthesisRequest("再见。", voice="alice"), {})
    english = labeller.explicit_for(synth, SynthesisRequest("Bye.", voice="alice"), {})
    other = labeller.explicit_for(synth, SynthesisRequest("你好。", voice="bob"), {})
    assert [r.text for r in synth.requests] == [
        "本音频由人工智能生成。",
        "This audio was generated by AI.",
        "本音频由人工智能生成。",
    ]
    assert [r.voice for r in synth.requests] == ["alice", "alice", "bob"] and labeller.notices.syntheses == 3
    np.testing.assert_array_equal(first.start, again.start)
    assert not np.array_equal(english.start, first.start) and other is not None
    spoken = len(first.start) - round(cue.PAUSE_S * RATE)  # the notice, then the pause before speech
    assert not first.start[spoken:].any() and not first.end[: round(cue.PAUSE_S * RATE)].any()
    delivered = Labeller.with_explicit(result(1.0), first)
    assert delivered.timings[0].start_s == pytest.approx(len(first.start) / RATE, abs=1e-3)
    np.testing.assert_array_equal(delivered.audio[: len(first.start)], first.start)


def test_a_bad_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="start_and_end"):
        Labeller(provider="p", secret=b"s", explicit="middle")
    with pytest.raises(ValueError, match="notice"):
        Labeller(provider="p", secret=b"s", explicit_kind="song")
