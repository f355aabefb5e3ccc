"""One list of accepted upload formats (`cosyserve.limits.AUDIO_SUFFIXES`): every suffix on it
decodes, and the API and the web UI refuse the same others (M4A, AAC, WebM) by name, listing it."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile
from tests.test_audio import speech_like

from cosyserve.frontend.audio import decode_audio
from cosyserve.limits import AUDIO_SUFFIX_LIST, AUDIO_SUFFIXES
from cosyserve.ui.bridge import UiBridge, UploadRefused
from cosyserve.ui.generate import error_message

# How each accepted suffix is written here: (libsndfile format, subtype, sample rate).
WRITERS = {
    ".wav": ("WAV", "PCM_16", 16000),
    ".wave": ("WAV", "FLOAT", 16000),
    ".flac": ("FLAC", "PCM_16", 16000),
    ".mp3": ("MP3", None, 16000),
    ".ogg": ("OGG", "VORBIS", 16000),
    ".oga": ("OGG", "VORBIS", 16000),
    ".opus": ("OGG", "OPUS", 48000),
    ".aif": ("AIFF", "PCM_16", 16000),
    ".aiff": ("AIFF", "PCM_16", 16000),
    ".au": ("AU", "PCM_16", 16000),
    ".snd": ("AU", "PCM_16", 16000),
    ".caf": ("CAF", "PCM_16", 16000),
    ".w64": ("W64", "PCM_16", 16000),
}
REFUSED = (".m4a", ".aac", ".webm", ".mp4", ".wma")


def test_every_accepted_suffix_is_tested() -> None:
    assert set(WRITERS) == set(AUDIO_SUFFIXES)
    assert not set(REFUSED) & set(AUDIO_SUFFIXES)


@pytest.mark.parametrize("suffix", AUDIO_SUFFIXES)
def test_every_accepted_suffix_decodes(tmp_path: Path, suffix: str) -> None:
    fmt, subtype, rate = WRITERS[suffix]
    path = tmp_path / f"prompt{suffix}"
    soundfile.write(path, speech_like(4.0, rate), rate, format=fmt, subtype=subtype)
    decoded = decode_audio(path)
    assert decoded.sample_rate == rate and abs(decoded.duration_s - 4.9) < 0.1


def _bridge() -> UiBridge:
    service = SimpleNamespace(settings=SimpleNamespace(limits=SimpleNamespace(max_upload_mb=10.0)))
    return UiBridge(service)  # type: ignore[arg-type]


def test_the_ui_takes_the_list_and_names_it_when_it_refuses(tmp_path: Path) -> None:
    bridge = _bridge()
    for suffix in (".opus", ".aiff", ".FLAC"):
        path = tmp_path / f"prompt{suffix}"
        path.write_bytes(b"RIFF")  # read_upload checks the name and size; decoding comes later
        assert bridge.read_upload(path) == (b"RIFF", suffix.lower())
    for suffix in REFUSED:
        path = tmp_path / f"prompt{suffix}"
        path.write_bytes(b"\0" * 16)
        with pytest.raises(UploadRefused) as refused:
            bridge.read_upload(path)
        message = error_message(refused.value, "en")
        assert suffix in message and AUDIO_SUFFIX_LIST in message
        assert AUDIO_SUFFIX_LIST in error_message(refused.value, "zh")


def test_the_api_refuses_the_same_by_name(start_api_server, prompt_wav_bytes) -> None:
    live = start_api_server()
    try:
        with live.client() as client:
            for suffix in REFUSED:
                files = {"audio": (f"prompt{suffix}", prompt_wav_bytes, "audio/mp4")}
                response = client.post("/v1/voices", data={"name": "bob"}, files=files)
                assert response.status_code == 415, response.text
                assert AUDIO_SUFFIX_LIST in response.json()["error"]["message"]
            opus = io.BytesIO()
            samples, rate = soundfile.read(io.BytesIO(prompt_wav_bytes), dtype="float32")
            soundfile.write(opus, np.asarray(samples), rate, format="OGG", subtype="OPUS")
            files = {"audio": ("prompt.opus", opus.getvalue(), "audio/ogg")}
            response = client.post("/v1/voices", data={"name": "bob"}, files=files)
            assert response.status_code == 201, response.text
    finally:
        live.stop()
