"""Which optional parts a server has (noise reduction, prompt transcription), what it says is missing and
the commands it gives; the low-SNR warning mentions noise reduction only where it is installed."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from cosyserve.frontend.audio import DecodedAudio
from cosyserve.frontend.prompt_check import check_prompt
from cosyserve.service.optional_parts import asr_part, denoise_part, optional_parts
from cosyserve.ui.optional_parts import parts_markdown


def missing(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make `import name` fail as it does when the package is not installed."""
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)


def test_denoise_installed_here() -> None:
    part = denoise_part()  # pyrnnoise is a test dependency
    assert part.installed and part.commands == ()


def test_denoise_missing_gives_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    missing(monkeypatch, "pyrnnoise", "pyrnnoise.rnnoise")
    part = denoise_part()
    assert not part.installed and part.missing == ("package",)
    assert part.commands == ("pip install 'cosyserve[denoise]'",)


def test_asr_stand_in_needs_neither_package_nor_download(monkeypatch, tmp_path) -> None:
    missing(monkeypatch, "sherpa_onnx")
    (tmp_path / "standin-asr.json").write_text(json.dumps({"transcript": "hi"}), encoding="utf-8")
    assert asr_part(tmp_path).installed


def test_asr_without_model_nor_package_lists_both_commands(monkeypatch, tmp_path) -> None:
    missing(monkeypatch, "sherpa_onnx")
    part = asr_part(tmp_path / "my asr")
    assert not part.installed and part.missing == ("package", "model")
    assert part.commands == (
        "pip install 'cosyserve[asr]'",
        f"cosyserve download --asr --dir '{tmp_path}/my asr'",
    )


def test_asr_model_without_the_package_is_not_ready(monkeypatch, tmp_path) -> None:
    """The model files alone do not make a transcriber: sherpa-onnx runs them."""
    missing(monkeypatch, "sherpa_onnx")
    (tmp_path / "model.int8.onnx").write_bytes(b"x")
    (tmp_path / "tokens.txt").write_text("a 0\n", encoding="utf-8")
    part = asr_part(tmp_path)
    assert not part.installed and part.missing == ("package",)
    assert part.commands == ("pip install 'cosyserve[asr]'",)


def test_default_asr_dir_gives_the_plain_download_command(monkeypatch, tmp_path) -> None:
    missing(monkeypatch, "sherpa_onnx")
    monkeypatch.setattr("cosyserve.modeldir.asr_download.default_asr_dir", lambda: tmp_path / "none")
    assert asr_part(None).commands[-1] == "cosyserve download --asr"


def test_note_in_both_languages(monkeypatch, tmp_path) -> None:
    missing(monkeypatch, "pyrnnoise", "pyrnnoise.rnnoise", "sherpa_onnx")
    parts = optional_parts(tmp_path)
    english = parts_markdown(parts, "en")
    assert "✗ Noise reduction (RNNoise): not installed (package missing)" in english
    assert "`pip install 'cosyserve[asr]'` then `cosyserve download --asr --dir" in english
    chinese = parts_markdown(parts, "zh")
    assert "未安装（缺少软件包、缺少模型）" in chinese and "重启服务" in chinese


def noisy_audio() -> DecodedAudio:
    """5 s of a speech-like tone with noise 10 dB under it, with silent margins."""
    rate = 16000
    rng = np.random.default_rng(0)
    t = np.arange(5 * rate) / rate
    speech = 0.3 * np.sin(2 * np.pi * 200 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    noise = rng.standard_normal(len(t)) * 0.3 / np.sqrt(2) * 10 ** (-10 / 20)
    samples = np.concatenate([speech + noise, np.zeros(rate // 2)]).astype(np.float32)
    return DecodedAudio(samples=samples, sample_rate=rate, channels=1, format="WAV")


def noisy_warning() -> str:
    return next(w for w in check_prompt(noisy_audio()).warnings if w.startswith("noisy recording"))


def test_low_snr_warning_points_to_noise_reduction_where_installed() -> None:
    assert "turn on noise reduction" in noisy_warning()


def test_low_snr_warning_without_the_extra_says_how_to_add_it(monkeypatch: pytest.MonkeyPatch) -> None:
    missing(monkeypatch, "pyrnnoise", "pyrnnoise.rnnoise")
    warning = noisy_warning()
    assert "turn on" not in warning
    assert "noise reduction is not installed on this server: pip install 'cosyserve[denoise]'" in warning
