"""Which optional parts this server has: noise reduction (the denoise extra) and prompt transcription
(the asr extra plus its model), and for each missing one the exact commands that add it.

The web UI shows this beside the prompt and in the admin tab, so a missing part is named, not silently
absent; the switches themselves are built only for the parts that are installed.
"""

from __future__ import annotations

import importlib
import shlex
from dataclasses import dataclass
from pathlib import Path

from cosyserve.frontend import asr as asr_module
from cosyserve.frontend import denoise as denoise_module
from cosyserve.service.transcription import asr_dir

DENOISE_INSTALL = denoise_module.INSTALL_COMMAND
ASR_INSTALL = "pip install 'cosyserve[asr]'"
ASR_DOWNLOAD = "cosyserve download --asr"


@dataclass(frozen=True)
class OptionalPart:
    """One optional part: whether it works here and, when not, what is missing and how to add it."""

    name: str  # "denoise" or "asr"
    installed: bool
    missing: tuple[str, ...] = ()  # what is not there: "package" and/or "model"
    commands: tuple[str, ...] = ()  # run these, in order, then restart the server
    where: str = ""  # the model directory looked in (asr)


def denoise_part() -> OptionalPart:
    """RNNoise through pyrnnoise: its network ships in the wheel, so the package is all it needs."""
    if denoise_module.denoise_available():
        return OptionalPart("denoise", True)
    return OptionalPart("denoise", False, ("package",), (DENOISE_INSTALL,))


def sherpa_available() -> bool:
    """Whether sherpa-onnx (the asr extra) imports here."""
    try:
        importlib.import_module("sherpa_onnx")
    except (ImportError, OSError):
        return False
    return True


def asr_part(configured: Path | None) -> OptionalPart:
    """SenseVoice-Small needs both the sherpa-onnx package and its model directory; a stand-in
    directory (tests, offline tries) needs neither package nor download."""
    directory = asr_dir(configured)
    if (directory / asr_module.STANDIN_FILE).is_file():
        return OptionalPart("asr", True, where=str(directory))
    missing, commands = [], []
    if not sherpa_available():
        missing.append("package")
        commands.append(ASR_INSTALL)
    if not asr_module.is_asr_dir(directory):
        missing.append("model")
        target = f" --dir {shlex.quote(str(directory))}" if configured is not None else ""
        commands.append(ASR_DOWNLOAD + target)
    return OptionalPart("asr", not missing, tuple(missing), tuple(commands), str(directory))


def optional_parts(asr_configured: Path | None) -> list[OptionalPart]:
    return [denoise_part(), asr_part(asr_configured)]
