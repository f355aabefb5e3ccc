"""The ONNX front models through the real onnxruntime path (with stand-in graphs), and `analyse_prompt`."""

from __future__ import annotations

import importlib.metadata
import io
import logging
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from cosyserve.errors import InputError, ModelDirError
from cosyserve.frontend.features import fbank80, whisper_logmel128
from cosyserve.frontend.onnx_models import (
    CAMPPLUS_FILE,
    SPEECH_TOKENIZER_FILE,
    SpeakerEncoder,
    SpeechTokenizer,
    choose_providers,
    onnxruntime_distributions,
)
from cosyserve.frontend.prompt_features import align_prompt, analyse_prompt
from cosyserve.frontend.standin_onnx import write_campplus_standin, write_speech_tokenizer_standin


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("onnx")
    write_campplus_standin(root / CAMPPLUS_FILE, seed=0)
    write_speech_tokenizer_standin(root / SPEECH_TOKENIZER_FILE, seed=0)
    return root


@pytest.fixture(scope="module")
def encoder(onnx_dir: Path) -> SpeakerEncoder:
    return SpeakerEncoder.from_model_dir(onnx_dir, device="cpu", intra_op_threads=1)


@pytest.fixture(scope="module")
def tokenizer(onnx_dir: Path) -> SpeechTokenizer:
    return SpeechTokenizer.from_model_dir(onnx_dir, device="auto", intra_op_threads=2)


def voiced(seconds: float, sr: int, seed: int = 0, f0: float = 150.0) -> np.ndarray:
    """Harmonic bursts with breath noise and 0.5 s of near-silence at both ends: (N,) float32."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    phase = 2 * np.pi * np.cumsum(f0 + 25.0 * np.sin(2 * np.pi * 0.6 * t)) / sr
    body = sum(np.sin(k * phase) / k for k in range(1, 6)) * np.clip(np.sin(2 * np.pi * 3 * t), 0.05, None)
    body = 0.15 * body + 0.01 * rng.standard_normal(t.size)
    pad = 1e-4 * rng.standard_normal(sr // 2)
    return np.concatenate([pad, body, pad]).astype(np.float32)


def wav_bytes(samples: np.ndarray, sr: int, subtype: str = "PCM_16") -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, sr, format="WAV", subtype=subtype)
    return buffer.getvalue()


# ---- stand-in graphs ----


def test_standins_are_deterministic(tmp_path: Path) -> None:
    for writer in (write_campplus_standin, write_speech_tokenizer_standin):
        a, b, c = (writer(tmp_path / f"{writer.__name__}_{i}.onnx", seed=s) for i, s in enumerate((3, 3, 4)))
        assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_official_tensor_names(encoder: SpeakerEncoder, tokenizer: SpeechTokenizer) -> None:
    assert [i.name for i in encoder.session.get_inputs()] == ["input"]
    assert [(i.name, i.type) for i in tokenizer.session.get_inputs()] == [
        ("feats", "tensor(float)"),
        ("feats_length", "tensor(int32)"),
    ]
    assert [o.name for o in tokenizer.session.get_outputs()] == ["indices"]


# ---- onnxruntime wrappers ----


def test_speaker_encoder_gives_192_floats(encoder: SpeakerEncoder) -> None:
    embedding = encoder(fbank80(voiced(3.0, 16000)))
    assert embedding.shape == (1, 192) and embedding.dtype == torch.float32
    assert torch.isfinite(embedding).all()
    other = encoder(fbank80(voiced(3.0, 16000, seed=1, f0=240.0)))
    assert not torch.allclose(embedding, other)  # a different voice, a different vector
    assert torch.equal(encoder(fbank80(voiced(3.0, 16000))[None]), embedding)  # (1, T, 80) also accepted


@pytest.mark.parametrize("seconds", [1.0, 3.0, 4.37])
def test_speech_tokenizer_gives_25hz_int_tokens(tokenizer: SpeechTokenizer, seconds: float) -> None:
    logmel = whisper_logmel128(voiced(seconds, 16000))
    tokens = tokenizer(logmel)
    assert tokens.dtype == torch.int32 and tokens.shape == (1, -(-logmel.shape[1] // 4))
    assert abs(tokens.shape[1] / (logmel.shape[1] / 100) - 25.0) < 1.0
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 6561


def test_int64_token_output_is_accepted(tmp_path: Path, tokenizer: SpeechTokenizer) -> None:
    path = write_speech_tokenizer_standin(tmp_path / "st64.onnx", seed=0, index_dtype=np.int64)
    logmel = whisper_logmel128(voiced(2.0, 16000))
    assert torch.equal(SpeechTokenizer(path, device="cpu")(logmel), tokenizer(logmel))


def test_speech_tokenizer_refuses_more_than_30_s(tokenizer: SpeechTokenizer) -> None:
    with pytest.raises(InputError, match="at most 30 s"):
        tokenizer(torch.zeros(1, 128, 3001))


def test_cuda_providers_name_the_device_and_are_checked_after_loading(
    onnx_dir: Path, monkeypatch, caplog
) -> None:
    """Issue 21, item 9: cuda:N must reach onnxruntime as device_id N, and what the session really
    loaded (`get_providers()`), not what the build contains, decides where it runs. This machine's
    onnxruntime is the CPU build: told it has CUDA, its real session falls back to the CPU."""
    import onnxruntime as ort

    monkeypatch.setattr(
        ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    assert choose_providers("cuda:1") == [("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"]
    assert choose_providers("cuda")[0] == ("CUDAExecutionProvider", {"device_id": 0})
    assert choose_providers("cpu") == ["CPUExecutionProvider"]
    asked: list = []
    real = ort.InferenceSession

    def session(*args, **kwargs):
        asked.append(kwargs["providers"])
        return real(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", session)
    with caplog.at_level(logging.WARNING, logger="cosyserve.frontend.onnx_models"):
        encoder = SpeakerEncoder.from_model_dir(onnx_dir, device="cuda:1", intra_op_threads=1)
    assert asked == [[("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"]]
    assert encoder.providers == ["CPUExecutionProvider"] and encoder.device == "cpu"
    assert "CUDA provider did not load" in caplog.text
    assert encoder(torch.zeros(1, 50, 80)).shape == (1, 192)  # and it works there


def test_two_onnxruntime_distributions_are_found(monkeypatch) -> None:
    installed = {"onnxruntime", "onnxruntime-gpu"}
    real = importlib.metadata.distribution

    def distribution(name: str):
        if name in installed:
            return real("torch")  # any installed distribution: only presence is read
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    assert onnxruntime_distributions() == ["onnxruntime", "onnxruntime-gpu"]


def test_sessions_use_explicit_threads_and_known_providers(encoder: SpeakerEncoder) -> None:
    assert encoder.providers[-1] == "CPUExecutionProvider"
    assert choose_providers("cpu") == ["CPUExecutionProvider"]
    assert choose_providers("auto")[-1] == "CPUExecutionProvider"
    with pytest.raises(ValueError, match="device"):
        choose_providers("tpu")


def test_unloadable_files_raise_model_dir_error(tmp_path: Path, onnx_dir: Path) -> None:
    with pytest.raises(ModelDirError, match="missing"):
        SpeakerEncoder(tmp_path / CAMPPLUS_FILE)
    corrupt = tmp_path / SPEECH_TOKENIZER_FILE
    corrupt.write_bytes(b"\x08\x07garbage" * 50)
    with pytest.raises(ModelDirError, match=r"cannot be loaded by onnxruntime.*cosyserve download"):
        SpeechTokenizer(corrupt)
    # swapped files are caught by their signatures
    with pytest.raises(ModelDirError, match="does not look like speech_tokenizer_v3"):
        SpeechTokenizer(onnx_dir / CAMPPLUS_FILE)
    with pytest.raises(ModelDirError, match="does not look like campplus"):
        SpeakerEncoder(onnx_dir / SPEECH_TOKENIZER_FILE)


# ---- analyse_prompt ----


def test_align_prompt_keeps_two_mel_frames_per_token() -> None:
    feat, tokens = align_prompt(torch.zeros(1, 175, 80), torch.zeros(1, 90, dtype=torch.int32))
    assert (feat.shape[1], tokens.shape[1]) == (174, 87)
    feat, tokens = align_prompt(torch.zeros(1, 170, 80), torch.zeros(1, 87, dtype=torch.int32))
    assert (feat.shape[1], tokens.shape[1]) == (170, 85)


@pytest.mark.parametrize("name", ["prompt_zh_24k.wav", "prompt_b_22k.wav"])
def test_analyse_real_prompts(
    shared_dir: Path, encoder: SpeakerEncoder, tokenizer: SpeechTokenizer, name: str
) -> None:
    features = analyse_prompt(shared_dir / "audio" / name, encoder, tokenizer)
    tokens = features.num_tokens
    assert features.speech_feat.shape == (1, 2 * tokens, 80) and features.speech_feat.dtype == torch.float32
    assert features.speech_feat_len.dtype == torch.int32 and features.speech_feat_len.tolist() == [2 * tokens]
    assert features.speech_token.dtype == torch.int32
    assert features.embedding.shape == (1, 192)
    assert features.report is not None
    assert abs(tokens / 25.0 - features.report.duration_s) < 0.1  # 25 tokens per second of trimmed prompt


@pytest.mark.parametrize(("sr", "channels"), [(8000, 1), (96000, 6), (44100, 2)])
def test_analyse_any_rate_and_channel_count(
    encoder: SpeakerEncoder, tokenizer: SpeechTokenizer, sr: int, channels: int
) -> None:
    multi = np.stack([voiced(3.5, sr, seed=c) for c in range(channels)], axis=1)
    features = analyse_prompt(wav_bytes(multi, sr), encoder, tokenizer)
    assert features.speech_feat.shape[1] == 2 * features.num_tokens
    assert abs(features.num_tokens / 25.0 - features.report.duration_s) < 0.1


def test_analyse_rejects_bad_prompts(encoder: SpeakerEncoder, tokenizer: SpeechTokenizer) -> None:
    with pytest.raises(InputError, match="only 1"):
        analyse_prompt(wav_bytes(voiced(1.0, 16000), 16000), encoder, tokenizer)
    with pytest.raises(InputError, match="could not be decoded"):
        analyse_prompt(b"RIFF\x00\x00\x00\x00WAVEjunk", encoder, tokenizer)
    with pytest.raises(ValueError, match="24 kHz"):
        analyse_prompt(wav_bytes(voiced(4.0, 16000), 16000), encoder, tokenizer, sample_rate=22050)


def test_loudness_does_not_change_the_prompt_much(
    encoder: SpeakerEncoder, tokenizer: SpeechTokenizer
) -> None:
    """Normalisation makes a quiet take and a loud take of the same audio give (nearly) the same features."""
    samples = voiced(4.0, 24000)
    loud = analyse_prompt(wav_bytes(samples, 24000, "FLOAT"), encoder, tokenizer)
    quiet = analyse_prompt(wav_bytes(samples * 0.2, 24000, "FLOAT"), encoder, tokenizer)
    assert torch.allclose(loud.speech_feat, quiet.speech_feat, atol=1e-3)
    assert torch.equal(loud.speech_token, quiet.speech_token)
