"""The two ONNX front models shipped with CosyVoice3, run with onnxruntime.

- `SpeakerEncoder` (`campplus.onnx`, CAM++): fbank80 (1, T, 80) float32 -> speaker embedding (1, 192).
- `SpeechTokenizer` (`speech_tokenizer_v3.onnx`): Whisper log-mel `feats` (1, 128, T) float32 plus
  `feats_length` (1,) int32 -> `indices`, T / 4 speech tokens (25 Hz) in [0, 6561).

Providers: CUDA on the engine's GPU (`device_id` of cuda:N) when the installed onnxruntime build has
it, checked after the session is made (`session.get_providers()`: a CUDA provider whose libraries do
not load falls back to the CPU silently); the CPU otherwise.

Inputs are fed by position, as the official front end does, so graphs whose tensor names differ still work;
the signature is checked when the file is opened so a wrong file fails early with a clear message.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from typing_extensions import Self

from cosyserve.errors import InputError, ModelDirError

log = logging.getLogger(__name__)

CAMPPLUS_FILE = "campplus.onnx"
SPEECH_TOKENIZER_FILE = "speech_tokenizer_v3.onnx"
FIX_HINT = "run `cosyserve download` to fetch the model again"


def default_intra_op_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


Provider = str | tuple[str, dict[str, Any]]
CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"
# Distributions that install the `onnxruntime` package; two at once overwrite each other's files.
ONNXRUNTIME_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino")


def _cuda_index(device: str) -> int | None:
    """The CUDA device index `device` asks for ("cuda" -> 0, "cuda:N" -> N), None for cpu/auto."""
    if device == "cuda":
        return 0
    if device.startswith("cuda:") and device[5:].isdigit():
        return int(device[5:])
    if device in ("auto", "cpu"):
        return None
    raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def choose_providers(device: str = "auto") -> list[Provider]:
    """`device` "auto" | "cpu" | "cuda" | "cuda:N" -> the providers to ask onnxruntime for: CUDA on that
    device (its `device_id`) then the CPU, when this onnxruntime build has the CUDA provider; else the
    CPU. "auto" uses GPU 0 when the build has CUDA and a GPU is usable. Whether CUDA then really loads
    (its libraries may be missing or of another CUDA version) only the session knows: `open_session`
    checks."""
    index = _cuda_index(device)
    has_cuda = CUDA_PROVIDER in ort.get_available_providers()
    if index is not None and not has_cuda:
        log.warning(
            "onnxruntime has no %s (the CPU build %s is installed): the prompt models run on the CPU; "
            "install the GPU build (see the README's GPU section)",
            CUDA_PROVIDER,
            ", ".join(onnxruntime_distributions()) or "onnxruntime",
        )
    if device == "auto" and has_cuda and torch.cuda.is_available():
        index = 0
    if index is not None and has_cuda:
        return [(CUDA_PROVIDER, {"device_id": index}), CPU_PROVIDER]
    return [CPU_PROVIDER]


def onnxruntime_distributions() -> list[str]:
    """The installed distributions that own the `onnxruntime` package (more than one is a broken
    install: they overwrite each other's files)."""
    found = []
    for name in ONNXRUNTIME_DISTRIBUTIONS:
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found.append(name)
    return found


def session_device(session: ort.InferenceSession) -> str:
    """Where a session really runs: "cuda:N" when its CUDA provider loaded, else "cpu"."""
    if CUDA_PROVIDER not in session.get_providers():
        return "cpu"
    options = session.get_provider_options().get(CUDA_PROVIDER, {})
    return f"cuda:{options.get('device_id', 0)}"


def open_session(
    path: str | Path, *, device: str = "auto", intra_op_threads: int | None = None, inter_op_threads: int = 1
) -> ort.InferenceSession:
    """A session with full graph optimisation and explicit thread counts; ModelDirError if unloadable.

    When CUDA was asked for, the session's own provider list says whether it loaded; if not, the
    session runs on the CPU and a warning says why (onnxruntime only logs it at its own level).
    """
    path = Path(path)
    if not path.is_file():
        raise ModelDirError(f"{path.name} is missing from {path.parent}; {FIX_HINT}")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = intra_op_threads or default_intra_op_threads()
    options.inter_op_num_threads = inter_op_threads
    providers = choose_providers(device)
    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as exc:  # onnxruntime raises its own non-public exception types
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelDirError(f"{path} cannot be loaded by onnxruntime ({first_line}); {FIX_HINT}") from exc
    wanted = next((p for p in providers if isinstance(p, tuple)), None)
    if wanted is not None and session_device(session) == "cpu":
        owners = onnxruntime_distributions()
        log.warning(
            "%s: onnxruntime's CUDA provider did not load (device_id %s; installed: %s): it runs on the "
            "CPU. Check that one onnxruntime-gpu build for this CUDA version is installed, alone",
            path.name,
            wanted[1]["device_id"],
            ", ".join(owners) or "none",
        )
    return session


def _input_signature(session: ort.InferenceSession) -> list[tuple[str, str, list]]:
    return [(node.name, node.type, list(node.shape)) for node in session.get_inputs()]


class _OnnxFrontModel:
    """An ONNX front model of the model directory: one onnxruntime session, inputs checked on open."""

    FILE_NAME = ""

    def __init__(
        self,
        path: str | Path,
        *,
        device: str = "auto",
        intra_op_threads: int | None = None,
        inter_op_threads: int = 1,
    ) -> None:
        self.path = Path(path)
        self.session = open_session(
            path, device=device, intra_op_threads=intra_op_threads, inter_op_threads=inter_op_threads
        )
        self._check_inputs(_input_signature(self.session))

    def _check_inputs(self, inputs: list[tuple[str, str, list]]) -> None:
        raise NotImplementedError

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, **kwargs: Any) -> Self:
        return cls(Path(model_dir) / cls.FILE_NAME, **kwargs)

    @property
    def providers(self) -> list[str]:
        """The providers the session really runs with (not those asked for)."""
        return self.session.get_providers()

    @property
    def device(self) -> str:
        """Where the session really runs: "cuda:N" or "cpu"."""
        return session_device(self.session)


class SpeakerEncoder(_OnnxFrontModel):
    """CAM++ speaker verification model: a fixed-size voice identity vector from a prompt's fbank."""

    FILE_NAME = CAMPPLUS_FILE

    def _check_inputs(self, inputs: list[tuple[str, str, list]]) -> None:
        shape = inputs[0][2] if len(inputs) == 1 else []
        if len(shape) != 3 or (isinstance(shape[2], int) and shape[2] != 80):  # a symbolic dim is a str
            raise ModelDirError(
                f"{self.path} does not look like campplus.onnx: expected one input of shape "
                f"(batch, frames, 80), found {inputs}; {FIX_HINT}"
            )
        self.input_name = inputs[0][0]

    def __call__(self, fbank: torch.Tensor) -> torch.Tensor:
        """fbank (T, 80) or (1, T, 80), mean-normalised -> embedding (1, D) float32 on the CPU (D = 192)."""
        feats = fbank.detach().to("cpu", torch.float32)
        if feats.dim() == 2:
            feats = feats[None]
        if feats.dim() != 3 or feats.shape[0] != 1 or feats.shape[2] != 80:
            raise InputError(
                f"the speaker encoder expects fbank of shape (1, T, 80), got {tuple(fbank.shape)}"
            )
        (embedding,) = self.session.run(None, {self.input_name: np.ascontiguousarray(feats.numpy())})[:1]
        return torch.from_numpy(np.asarray(embedding, dtype=np.float32).reshape(1, -1).copy())


class SpeechTokenizer(_OnnxFrontModel):
    """Supervised semantic speech tokenizer: 25 Hz discrete tokens from a 16 kHz prompt's Whisper log-mel."""

    FILE_NAME = SPEECH_TOKENIZER_FILE
    MAX_FRAMES = 3000  # 30 s at 100 frames per second; the model was not built for longer input

    def _check_inputs(self, inputs: list[tuple[str, str, list]]) -> None:
        if len(inputs) != 2 or len(inputs[0][2]) != 3 or len(inputs[1][2]) != 1:
            raise ModelDirError(
                f"{self.path} does not look like speech_tokenizer_v3.onnx: expected inputs "
                f"feats (1, 128, T) and feats_length (1,), found {inputs}; {FIX_HINT}"
            )
        self.feats_name, self.length_name = inputs[0][0], inputs[1][0]
        self.length_dtype = np.int64 if inputs[1][1] == "tensor(int64)" else np.int32

    def __call__(self, logmel: torch.Tensor) -> torch.Tensor:
        """Whisper log-mel (128, T) or (1, 128, T) -> speech tokens (1, T / 4) int32 on the CPU."""
        feats = logmel.detach().to("cpu", torch.float32)
        if feats.dim() == 2:
            feats = feats[None]
        if feats.dim() != 3 or feats.shape[0] != 1:
            raise InputError(
                f"the speech tokenizer expects log-mel of shape (1, 128, T), got {tuple(logmel.shape)}"
            )
        frames = feats.shape[2]
        if frames > self.MAX_FRAMES:
            raise InputError(
                f"the prompt is {frames / 100:.1f} s long; the speech tokenizer accepts at most 30 s: "
                "use a shorter prompt"
            )
        feed = {
            self.feats_name: np.ascontiguousarray(feats.numpy()),
            self.length_name: np.array([frames], dtype=self.length_dtype),
        }
        (indices,) = self.session.run(None, feed)[:1]
        indices = np.asarray(indices)
        if not np.issubdtype(indices.dtype, np.integer):
            raise ModelDirError(
                f"{self.path} returned {indices.dtype} tokens instead of integers; {FIX_HINT}"
            )
        return torch.from_numpy(indices.reshape(1, -1).astype(np.int32))
