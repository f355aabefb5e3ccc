"""`cosyserve download --asr`: the prompt-transcription model, fetched and resumed like the main model.

SenseVoice-Small exported for sherpa-onnx (about 230 MB for the int8 model). The same retry, resume and
hub-fallback logic as `download_model`; only the files and their checks differ.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from cosyserve.errors import ModelDirError
from cosyserve.frontend.asr import STANDIN_FILE, TOKENS_FILE, is_asr_dir
from cosyserve.modeldir.download import Fetcher, default_target_dir, download_model

ASR_MODEL_ID = "csukuangfj/sherpa-onnx-sense-voice-zh-en-ja-ko-yue-2024-07-17"
# The float32 export and the test wavs are not needed: the int8 model is what runs.
ASR_SKIP_PATTERNS = ("model.onnx", "test_wavs/*", "*.py", "*.sh")
ASR_MIN_SIZES = {"model.int8.onnx": 100_000_000, TOKENS_FILE: 10_000}


def default_asr_dir() -> Path:
    return default_target_dir(ASR_MODEL_ID)


def verify_asr_dir(target: Path, min_sizes: Mapping[str, int] = ASR_MIN_SIZES) -> Path:
    """The directory when it holds a usable recogniser; ModelDirError naming what is missing or short."""
    target = Path(target)
    if (target / STANDIN_FILE).is_file():
        return target
    problems = []
    for name, size in min_sizes.items():
        path = target / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif path.stat().st_size < size:
            problems.append(f"{name} is {path.stat().st_size:,} bytes, expected at least {size:,}")
    if problems or not is_asr_dir(target):
        raise ModelDirError(
            f"{target} is not a complete ASR model: {'; '.join(problems) or 'no model file'}; "
            "run `cosyserve download --asr` again to resume"
        )
    return target


def download_asr(
    *,
    source: str | None = None,
    target_dir: str | Path | None = None,
    progress: bool = True,
    min_sizes: Mapping[str, int] = ASR_MIN_SIZES,
    fetchers: Mapping[str, Fetcher] | None = None,
    log: Callable[[str], None] | None = None,
    retry_budget_s: float | None = 30.0,
) -> Path:
    """Download SenseVoice-Small for sherpa-onnx into `target_dir` (default: next to the main model)."""
    return download_model(
        ASR_MODEL_ID,
        source=source,
        target_dir=target_dir or default_asr_dir(),
        progress=progress,
        skip_patterns=ASR_SKIP_PATTERNS,
        fetchers=fetchers,
        log=log,
        retry_budget_s=retry_budget_s,
        verify=lambda target: verify_asr_dir(target, min_sizes),
    )
