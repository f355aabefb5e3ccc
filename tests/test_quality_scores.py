"""The take scores on real recordings and on made-up failures: each check catches what it is for and
lets real speech through (`service.quality`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from onnx import TensorProto, helper, numpy_helper

from cosyserve.frontend.onnx_models import SpeakerEncoder
from cosyserve.frontend.standin_onnx import _save
from cosyserve.service.quality import (
    QualityThresholds,
    TakePolicy,
    TakeReport,
    TakeScores,
    best_take,
    take_seed,
)
from cosyserve.service.quality.error_rate import error_rate
from cosyserve.service.quality.pace import spoken_units, voice_seconds_per_unit
from cosyserve.service.quality.repetition import repetition_ratio
from cosyserve.service.quality.scorer import TakeInput, TakeScorer
from cosyserve.service.quality.signal_checks import clipping_ratio, silence_profile, spectral_flatness
from cosyserve.service.quality.similarity import cosine, speaker_embedding

# About as many syllables as prompt_b says in its 13.7 s (an English speaker; the words are not needed).
ENGLISH_TEXT = (
    "Then that is all, the watches are all going as soon as the courses in football start; simple ideas, "
    "how many are existing, you would say yes, yeah, the woods, and all saints as a warning."
)


def _recording(shared_dir: Path, name: str) -> tuple[np.ndarray, int]:
    audio, rate = sf.read(shared_dir / "audio" / name, dtype="float32")
    return (audio.mean(axis=1) if audio.ndim > 1 else audio), rate


@pytest.fixture(scope="module")
def english(shared_dir: Path) -> tuple[np.ndarray, int]:
    return _recording(shared_dir, "prompt_b_22k.wav")


@pytest.fixture(scope="module")
def chinese(shared_dir: Path) -> tuple[np.ndarray, int]:
    return _recording(shared_dir, "prompt_zh_24k.wav")


@pytest.fixture(scope="module")
def statistics_encoder(tmp_path_factory: pytest.TempPathFactory) -> SpeakerEncoder:
    """A CAM++-shaped encoder that pools what a speaker encoder pools (the per-band spread of the
    mean-removed fbank) through a fixed projection; the demo's stand-in pools the mean, which the fbank's
    mean removal makes constant. The real campplus.onnx is not available offline."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((80, 192))
    weight = (weight - weight.mean(axis=0)).astype(np.float32)  # the common loudness cancels out
    nodes = [
        helper.make_node("Mul", ["input", "input"], ["squared"]),
        helper.make_node("ReduceMean", ["squared"], ["variance"], axes=[1], keepdims=0),
        helper.make_node("Sqrt", ["variance"], ["spread"]),
        helper.make_node("MatMul", ["spread", "weight"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes,
        "statistics_pooling",
        inputs=[helper.make_tensor_value_info("input", TensorProto.FLOAT, ["B", "T", 80])],
        outputs=[helper.make_tensor_value_info("output", TensorProto.FLOAT, ["B", 192])],
        initializer=[numpy_helper.from_array(weight, "weight")],
    )
    path = _save(graph, tmp_path_factory.mktemp("encoder") / "campplus.onnx", "test")
    return SpeakerEncoder(path, device="cpu")


def test_the_same_speaker_scores_higher_than_another(statistics_encoder, english, chinese) -> None:
    halves = {}
    for name, (audio, rate) in {"en": english, "zh": chinese}.items():
        middle = len(audio) // 2
        halves[name] = [
            speaker_embedding(statistics_encoder, part, rate) for part in (audio[:middle], audio[middle:])
        ]
    for name, other in (("en", "zh"), ("zh", "en")):
        same = cosine(halves[name][0], halves[name][1])
        for mine in halves[name]:
            for theirs in halves[other]:
                assert same > cosine(mine, theirs) + 0.1, (name, same, cosine(mine, theirs))


def test_similarity_runs_the_prompt_code_on_the_output(statistics_encoder, chinese) -> None:
    """The output's embedding is made exactly as the prompt's: identical audio scores 1."""
    from cosyserve.frontend.features import fbank80
    from cosyserve.frontend.prompt_features import condition_prompt

    audio, rate = chinese
    wav16k, _ = condition_prompt(audio, rate)
    prompt = statistics_encoder(fbank80(wav16k))
    assert cosine(prompt, speaker_embedding(statistics_encoder, wav16k, 16000)) == pytest.approx(
        1.0, abs=1e-5
    )
    assert speaker_embedding(statistics_encoder, audio[: rate // 4], rate) is None  # too short: no score


def test_a_looped_token_sequence_is_caught() -> None:
    rng = np.random.default_rng(1)
    natural = rng.integers(0, 6561, 300).tolist()
    phrase = rng.integers(0, 6561, 30).tolist()
    looped = natural[:60] + phrase * 8
    limit = QualityThresholds().max_repetition
    assert repetition_ratio([natural]) == 0.0
    assert repetition_ratio([looped]) > 0.6 > 1.5 * limit
    assert repetition_ratio([[7] * 200]) == 0.0  # a run of one code is the silence check's business
    assert repetition_ratio([phrase, phrase]) == 0.0  # the same words in two sentences are not a loop


def _scores(audio: np.ndarray, rate: int, text: str, voice_rate: float | None, **kwargs) -> TakeScores:
    scorer = TakeScorer(None)
    return scorer.score(TakeInput(audio, rate, text, voice_seconds_per_unit=voice_rate, **kwargs))


def test_real_speech_passes_and_a_truncated_take_is_caught(english) -> None:
    audio, rate = english
    voice_rate = voice_seconds_per_unit(round(len(audio) / rate * 25), ENGLISH_TEXT)
    whole = _scores(audio, rate, ENGLISH_TEXT, voice_rate)
    assert whole.passed, whole
    assert 0.7 < whole.pace_ratio < 1.3
    truncated = _scores(audio[: len(audio) // 3], rate, ENGLISH_TEXT, voice_rate)
    assert "duration" in truncated.failed and truncated.pace_ratio < 0.5
    drawn_out = _scores(np.concatenate([audio] * 3), rate, ENGLISH_TEXT, voice_rate)
    assert "duration" in drawn_out.failed  # babbling on for three times as long


def test_the_language_pace_judges_a_take_without_a_transcript(chinese) -> None:
    audio, rate = chinese
    text = "希望你以后能够做的比我还好呦。"
    assert spoken_units(text) == 14
    scores = _scores(audio, rate, text, None)
    assert scores.passed and 0.7 < scores.pace_ratio < 1.3, scores
    assert _scores(audio, rate, "你好", None).pace_ratio is None  # too short to judge


def test_pauses_silence_clipping_and_noise(english, chinese) -> None:
    audio, rate = english
    gap = np.zeros(3 * rate, np.float32)
    middle = len(audio) // 2
    paused = _scores(np.concatenate([audio[:middle], gap, audio[middle:]]), rate, ENGLISH_TEXT, None)
    assert "pause" in paused.failed and paused.longest_pause_s == pytest.approx(3.0, abs=0.3)
    lead = silence_profile(np.concatenate([gap, audio, gap]), rate)
    assert lead.longest_pause_s < 1.0  # the model's lead and tail silence is not a pause
    clipped = np.clip(audio * 20, -1, 1)
    assert clipping_ratio(audio) < QualityThresholds().max_clipping_ratio / 100  # a peak touching full scale
    assert "clipping" in _scores(clipped, rate, ENGLISH_TEXT, None).failed
    noise = np.random.default_rng(0).standard_normal(len(audio)).astype(np.float32) * 0.1
    assert "noise" in _scores(noise, rate, ENGLISH_TEXT, None).failed
    limit = QualityThresholds().max_flatness
    for speech, speech_rate in (english, chinese):
        assert spectral_flatness(speech, speech_rate) < limit / 5


def test_error_rate_alignment() -> None:
    assert error_rate("The cat sat on the mat.", "the cat sat on the mat") == 0.0
    assert error_rate("the cat sat on the mat", "the cat sat on mat") == pytest.approx(1 / 6)  # a deletion
    assert error_rate("the cat sat", "a dog sat down") == pytest.approx(3 / 3)  # 2 substitutions, 1 insertion
    assert error_rate("今天天气很好", "今天天汽很好") == pytest.approx(1 / 6)  # by character
    assert error_rate("", "") == 0.0 and error_rate("", "words") == 1.0


def test_an_asr_adds_intelligibility(english) -> None:
    audio, rate = english
    heard = TakeScorer(None, transcriber=lambda a, r: ENGLISH_TEXT.upper())
    assert heard.score(TakeInput(audio, rate, ENGLISH_TEXT)).error_rate == 0.0
    wrong = TakeScorer(None, transcriber=lambda a, r: "something else entirely")
    assert "intelligibility" in wrong.score(TakeInput(audio, rate, ENGLISH_TEXT)).failed

    def broken(a: np.ndarray, r: int) -> str:
        raise RuntimeError("no model")

    assert TakeScorer(None, transcriber=broken).score(TakeInput(audio, rate, ENGLISH_TEXT)).error_rate is None


def test_the_kept_take_and_its_seed() -> None:
    failing_two = TakeScores(similarity=0.9, failed=("noise", "pause"))
    failing_one_low = TakeScores(similarity=0.2, failed=("similarity",))
    failing_one_high = TakeScores(similarity=0.4, failed=("noise",))
    assert best_take([failing_two, failing_one_low, failing_one_high]) == 2
    assert best_take([failing_one_low, TakeScores(similarity=0.1)]) == 1  # a pass beats any failure
    assert best_take([TakeScores(), TakeScores()]) == 0
    assert take_seed(5, 2, 2**31 - 1) == 7 and take_seed(2**31 - 1, 1, 2**31 - 1) == 0
    with pytest.raises(ValueError):
        TakePolicy(takes=0)
    with pytest.raises(ValueError):
        QualityThresholds().with_overrides(min_loudness=1.0)
    assert QualityThresholds().with_overrides(min_similarity=0.3, max_pause_s=None).min_similarity == 0.3


def test_the_report_as_headers_and_fields() -> None:
    report = TakeReport(TakeScores(similarity=0.61234, pace_ratio=1.1, failed=("pause",)), takes=3)
    headers = report.headers()
    assert headers["X-Takes"] == "3" and headers["X-Take-Passed"] == "false"
    assert headers["X-Take-Similarity"] == "0.612" and headers["X-Take-Failed"] == "pause"
    fields = report.as_dict()
    assert fields["takes"] == 3 and fields["failed"] == ["pause"] and fields["similarity"] == 0.6123
    assert "X-Take-Error-Rate" not in headers  # no ASR, no header


def test_where_users_see_the_scores() -> None:
    from cosyserve.service.batches.dub_report import report_document
    from cosyserve.service.quality.reporting import (
        combined_report,
        listen_list,
        manifest_columns,
        needs_listen,
        stored_fields,
    )
    from cosyserve.ui.take_badge import take_badge

    good = TakeReport(TakeScores(similarity=0.7, pace_ratio=1.0), takes=1)
    bad = TakeReport(TakeScores(similarity=0.3, pace_ratio=2.5, failed=("similarity", "duration")), takes=3)
    job = combined_report([good, None, bad])
    assert job.takes == 3 and job.scores.similarity == 0.3 and job.scores.pace_ratio == 2.5
    assert job.scores.failed == ("similarity", "duration") and combined_report([None]) is None

    columns = manifest_columns(stored_fields(bad))
    assert columns["check"] == "listen" and columns["take_failed"] == "similarity duration"
    assert manifest_columns(stored_fields(good))["check"] == "" and manifest_columns({}) == {}
    assert (
        needs_listen(stored_fields(bad)) and not needs_listen(stored_fields(good)) and not needs_listen(None)
    )
    rows = [
        {"position": 1, "text": "a", "file_position": 1, **columns},
        {"position": 2, "text": "b", "file_position": 2},
    ]
    assert listen_list(rows) == [{"position": 1, "text": "a", "failed": ["similarity", "duration"]}]
    assert report_document(rows)["check_these"] == listen_list(rows)

    badge = take_badge(bad, "en")
    assert 'data-state="failed"' in badge and "3 takes" in badge and "similarity 0.30" in badge
    assert "✓" in take_badge(good, "zh") and take_badge(None, "en") == ""


def test_a_report_crosses_the_queue() -> None:
    """A worker's outcome reaches an API node as JSON (`distributed.codec`) with its scores."""
    import json

    from cosyserve.service.outcomes import TtsOutcome
    from cosyserve.service.wire import decode_outcome, encode_outcome

    report = TakeReport(TakeScores(similarity=0.7, failed=("pause",)), takes=2)
    outcome = TtsOutcome(1, 1.0, 25, "id", "/x.wav", "audio/wav", quality=report)
    back = decode_outcome(json.loads(json.dumps(encode_outcome(outcome))))
    assert back.quality == report and back.quality.headers() == report.headers()
    assert (
        decode_outcome(
            json.loads(json.dumps(encode_outcome(TtsOutcome(1, 1.0, 25, None, None, "a"))))
        ).quality
        is None
    )
