"""Prompt transcription: the stand-in recogniser (same interface as SenseVoice), `download --asr` against a
local fake hub (never the network), the API's `transcribe=true`, and the real SenseVoice-Small model only
when it has been downloaded here."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from cosyserve.errors import InputError, ModelDirError
from cosyserve.frontend.asr import STANDIN_FILE, load_recognizer, transcribe_audio
from cosyserve.modeldir.asr_download import default_asr_dir, download_asr, verify_asr_dir
from cosyserve.service.transcription import transcribe

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def standin(directory: Path, words: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / STANDIN_FILE).write_text(json.dumps({"transcript": words}, ensure_ascii=False))
    return directory


def test_standin_transcribes_through_the_same_path(tmp_path: Path, prompt_wav_bytes: bytes) -> None:
    model = standin(tmp_path / "asr", "希望你以后能够做的比我还好呦。")
    assert transcribe_audio(load_recognizer(model), prompt_wav_bytes) == "希望你以后能够做的比我还好呦。"
    assert transcribe(model, prompt_wav_bytes) == "希望你以后能够做的比我还好呦。"
    with pytest.raises(InputError, match="no speech"):
        transcribe(standin(tmp_path / "silent", ""), prompt_wav_bytes)
    with pytest.raises(InputError, match="download --asr"):
        transcribe(tmp_path / "nothing-here", prompt_wav_bytes)


class FakeHub:
    """Copies a fake SenseVoice export into the target like snapshot_download."""

    def __init__(self, remote: Path) -> None:
        self.remote, self.calls = remote, []

    def __call__(self, model_id: str, target: Path, *, skip_patterns: Sequence[str], progress: bool) -> None:
        self.calls.append((model_id, tuple(skip_patterns)))
        for path in self.remote.iterdir():
            if path.name not in skip_patterns:
                shutil.copy(path, target / path.name)


def test_download_asr_fetches_and_verifies(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / "model.int8.onnx").write_bytes(os.urandom(3000))
    (remote / "tokens.txt").write_text("<unk> 0\n" * 300)
    (remote / "model.onnx").write_bytes(b"the float32 export is skipped")
    hub = FakeHub(remote)
    sizes = {"model.int8.onnx": 2000, "tokens.txt": 1000}
    target = download_asr(
        target_dir=tmp_path / "asr",
        fetchers={"huggingface": hub},
        source="huggingface",
        min_sizes=sizes,
        log=print,
    )
    assert (target / "model.int8.onnx").is_file() and not (target / "model.onnx").exists()
    assert hub.calls[0][0].endswith("sherpa-onnx-sense-voice-zh-en-ja-ko-yue-2024-07-17")
    again = download_asr(target_dir=target, fetchers={}, source="huggingface", min_sizes=sizes, log=print)
    assert again == target and len(hub.calls) == 1  # complete: the hub is not asked again
    (target / "model.int8.onnx").write_bytes(b"cut")
    with pytest.raises(ModelDirError, match=r"model\.int8\.onnx is 3 bytes"):
        verify_asr_dir(target, sizes)


def test_api_transcribes_when_asked(
    tmp_path: Path, api_synthesizer, demo_model_path, prompt_wav_bytes
) -> None:
    from conftest import LiveServer, sharing
    from cosyserve.api.app import create_app
    from cosyserve.service.assembly import Service
    from cosyserve.service.settings import Settings

    words = "希望你以后能够做的比我还好呦。"
    settings = Settings(
        model=str(demo_model_path),
        device="cpu",
        data_dir=tmp_path / "data",
        asr_model=standin(tmp_path / "asr", words),
    )
    service = Service(settings, synthesizer_factory=sharing(api_synthesizer))
    server = LiveServer(create_app(service), service).start().wait_ready()
    try:
        with server.client() as client:
            files = {"prompt_wav": ("p.wav", prompt_wav_bytes, "audio/wav")}
            answer = client.post(
                "/v1/tts", data={"text": "你好。", "transcribe": "true", "seed": "3"}, files=files
            )
            assert answer.status_code == 200, answer.text
            output = service.outputs.get(answer.headers["x-cosyserve-output-id"])
            assert output.manifest["prompt_text"] == words  # zero-shot with the transcript it heard
    finally:
        server.stop()


@pytest.mark.skipif(
    not (default_asr_dir() / "tokens.txt").is_file(), reason="SenseVoice-Small is not downloaded here"
)
def test_real_sensevoice_transcribes_the_prompt(prompt_wav_bytes: bytes) -> None:  # pragma: no cover
    pytest.importorskip("sherpa_onnx")
    text = transcribe(None, prompt_wav_bytes)
    assert "希望" in text and "好" in text
