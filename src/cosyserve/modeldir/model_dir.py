"""Finding and validating an official CosyVoice3 model directory (`Fun-CosyVoice3-0.5B-2512`).

The directory is used as downloaded: same files, same names, no conversion step.
"""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from cosyserve.errors import ModelDirError
from cosyserve.model.config import CosyVoice3Config, read_cosyvoice3_config

DEFAULT_MODEL_ID = "FunAudioLLM/Fun-CosyVoice3-0.5B-2512"
TOKENIZER_DIR = "CosyVoice-BlankEN"

# name -> smallest plausible size in bytes. The tiny parity model and the demo model are far smaller
# than the real files, so sizes only catch empty/truncated downloads; `.pt` files are also opened as zips.
REQUIRED_FILES: dict[str, int] = {
    "cosyvoice3.yaml": 100,
    "llm.pt": 1024,
    "flow.pt": 1024,
    "hift.pt": 1024,
    "campplus.onnx": 64,
    "speech_tokenizer_v3.onnx": 64,
    f"{TOKENIZER_DIR}/config.json": 50,
    f"{TOKENIZER_DIR}/vocab.json": 50,
    f"{TOKENIZER_DIR}/merges.txt": 10,
    f"{TOKENIZER_DIR}/tokenizer_config.json": 10,
}
ONNX_FILES = ("campplus.onnx", "speech_tokenizer_v3.onnx")
# Sizes of the real 0.5B files, for the download check (a partial file is caught before it is used).
REAL_MODEL_MIN_SIZES: dict[str, int] = {
    "llm.pt": 1_000_000_000,
    "flow.pt": 600_000_000,
    "hift.pt": 40_000_000,
    "campplus.onnx": 20_000_000,
    "speech_tokenizer_v3.onnx": 500_000_000,
}
FIX_HINT = "run `cosyserve download` to fetch the model again, or pass --model with the right directory"


@dataclass(frozen=True)
class ModelDir:
    """A validated model directory. Build it with `ModelDir.open(path)`."""

    path: Path
    has_onnx: bool  # the parity fixture ships no ONNX front models; everything else does

    @classmethod
    def open(cls, path: str | Path, *, require_onnx: bool = True) -> ModelDir:
        """Validate `path` and return it; raise ModelDirError naming the first problem and the fix."""
        root = Path(path).expanduser()
        if not root.is_dir():
            raise ModelDirError(f"model directory {root} does not exist; {FIX_HINT}")
        if (root / "cosyvoice2.yaml").is_file() and not (root / "cosyvoice3.yaml").is_file():
            raise ModelDirError(
                f"{root} is a CosyVoice2 model (cosyvoice2.yaml): only CosyVoice3 is supported for now: "
                "download FunAudioLLM/Fun-CosyVoice3-0.5B-2512 with `cosyserve download`"
            )
        if (root / "cosyvoice.yaml").is_file() and not (root / "cosyvoice3.yaml").is_file():
            raise ModelDirError(
                f"{root} is a CosyVoice 1 model (cosyvoice.yaml); cosyserve supports CosyVoice3 only"
            )
        problems = []
        for name, min_size in REQUIRED_FILES.items():
            if name in ONNX_FILES and not require_onnx:
                continue
            problem = _check_file(root / name, min_size)
            if problem:
                problems.append(problem)
        if problems:
            raise ModelDirError(f"model directory {root} is incomplete: {'; '.join(problems)}; {FIX_HINT}")
        has_onnx = all((root / name).is_file() for name in ONNX_FILES)
        return cls(root.resolve(), has_onnx)

    @cached_property
    def config(self) -> CosyVoice3Config:
        return read_cosyvoice3_config(
            self.path / "cosyvoice3.yaml", self.path / TOKENIZER_DIR / "config.json"
        )

    @cached_property
    def fingerprint(self) -> str:
        """A cheap identity of the weights (names, sizes, first and last MiB of each checkpoint).

        Recorded in every output's provenance manifest and with every saved voice; hashing the
        whole 4 GB would add many seconds to start-up.
        """
        digest = hashlib.sha256()
        for name in ("cosyvoice3.yaml", "llm.pt", "flow.pt", "hift.pt", *ONNX_FILES):
            path = self.path / name
            if not path.is_file():
                continue
            size = path.stat().st_size
            digest.update(f"{name}:{size};".encode())
            with path.open("rb") as handle:
                digest.update(handle.read(1 << 20))
                if size > 2 << 20:
                    handle.seek(-(1 << 20), 2)
                    digest.update(handle.read())
        return digest.hexdigest()[:16]

    @property
    def tokenizer_dir(self) -> Path:
        return self.path / TOKENIZER_DIR

    def file(self, name: str) -> Path:
        return self.path / name


def _check_file(path: Path, min_size: int) -> str | None:
    if not path.is_file():
        return f"{path.name} is missing"
    size = path.stat().st_size
    if size < min_size:
        return f"{path.name} is truncated ({size} bytes)"
    if path.suffix == ".pt" and not zipfile.is_zipfile(path):
        return f"{path.name} is corrupt (not a PyTorch zip archive)"
    return None
