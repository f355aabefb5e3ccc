"""The intelligibility check on real English speech: Debian's flite speaks a sentence, pocketsphinx (its US
English model ships in the wheel) transcribes it, and the take scorer's WER tells the right text from a
wrong one. In CI both must be installed (`scripts/test.sh` installs them); elsewhere the test is skipped."""

from __future__ import annotations

import shutil
import subprocess
from math import gcd
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from scipy.signal import resample_poly

from conftest import require_installed
from cosyserve.service.quality.scorer import TakeInput, TakeScorer

SAID = "please call stella and ask her to bring these things with her from the store"
NOT_SAID = "the weather will be cold and windy tomorrow so wear a warm coat"
ASR_RATE = 16000  # what the pocketsphinx model was trained on


@pytest.fixture(scope="module")
def english_speech(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, int]:
    """(S,) float32 speech of SAID at flite's rate."""
    require_installed("flite (apt-get install flite)", shutil.which("flite") is not None)
    path = Path(tmp_path_factory.mktemp("flite")) / "said.wav"
    subprocess.run(["flite", "-voice", "slt", "-t", SAID, "-o", str(path)], check=True, timeout=60)
    audio, rate = sf.read(path, dtype="float32")
    return audio, rate


def pocketsphinx_transcribe(audio: np.ndarray, sample_rate: int) -> str:
    """A `Transcriber`: 16 kHz 16-bit PCM through pocketsphinx's default US English decoder."""
    from pocketsphinx import Decoder

    step = gcd(ASR_RATE, sample_rate)
    resampled = resample_poly(audio, ASR_RATE // step, sample_rate // step)
    pcm = (np.clip(resampled, -1.0, 1.0) * 32767).astype(np.int16).tobytes()
    decoder = Decoder(samprate=ASR_RATE)
    decoder.start_utt()
    decoder.process_raw(pcm, full_utt=True)
    decoder.end_utt()
    return decoder.hyp().hypstr if decoder.hyp() is not None else ""


def test_the_error_rate_tells_the_right_text_from_a_wrong_one(english_speech) -> None:
    try:
        import pocketsphinx  # noqa: F401
    except ImportError:
        require_installed("pocketsphinx (the test extra)", False)
    audio, rate = english_speech
    scorer = TakeScorer(None, transcriber=pocketsphinx_transcribe)
    right = scorer.score(TakeInput(audio, rate, SAID))
    wrong = scorer.score(TakeInput(audio, rate, NOT_SAID))
    # Measured: WER 0.13 ("stella and" heard as "stallion"), against 1.08 for the wrong text.
    assert right.error_rate is not None and right.error_rate <= 0.25, right.transcript
    assert wrong.error_rate is not None and wrong.error_rate >= 0.8, wrong.transcript
    assert "intelligibility" not in right.failed and "intelligibility" in wrong.failed
