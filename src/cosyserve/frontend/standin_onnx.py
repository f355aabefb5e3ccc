"""Small deterministic stand-ins for `campplus.onnx` and `speech_tokenizer_v3.onnx`.

They have the official tensor names, ranks, dtypes and rates, so everything around them (session options,
feeding, output handling, prompt trimming) runs the real code path, in tests and in the demo model.
Their numbers mean nothing: they are fixed random projections, seeded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
EMBEDDING_DIM = 192
FBANK_BINS = 80
WHISPER_BINS = 128
SPEECH_CODEBOOK = 6561  # 3 ** 8 finite scalar quantisation codes
FRAMES_PER_TOKEN = 4  # 100 Hz log-mel frames -> 25 Hz tokens


def _save(graph: onnx.GraphProto, path: str | Path, producer: str) -> Path:
    model = helper.make_model(graph, producer_name=producer, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8  # readable by onnxruntime >= 1.14
    onnx.checker.check_model(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def write_campplus_standin(path: str | Path, seed: int = 0) -> Path:
    """Write a speaker-encoder stand-in: `input` (B, T, 80) float32 -> `output` (B, 192) float32.

    Time-mean of the fbank, a fixed projection, tanh: different voices give different embeddings.
    """
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal((FBANK_BINS, EMBEDDING_DIM)) / np.sqrt(FBANK_BINS)).astype(np.float32)
    bias = (0.1 * rng.standard_normal(EMBEDDING_DIM)).astype(np.float32)
    nodes = [
        helper.make_node("ReduceMean", ["input"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "weight"], ["projected"]),
        helper.make_node("Add", ["projected", "bias"], ["shifted"]),
        helper.make_node("Tanh", ["shifted"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes,
        "campplus_standin",
        inputs=[helper.make_tensor_value_info("input", TensorProto.FLOAT, ["B", "T", FBANK_BINS])],
        outputs=[helper.make_tensor_value_info("output", TensorProto.FLOAT, ["B", EMBEDDING_DIM])],
        initializer=[numpy_helper.from_array(weight, "weight"), numpy_helper.from_array(bias, "bias")],
    )
    return _save(graph, path, "cosyserve-standin-campplus")


def write_speech_tokenizer_standin(path: str | Path, seed: int = 0, index_dtype: type = np.int32) -> Path:
    """Write a speech-tokenizer stand-in: `feats` (B, 128, T) float32 + `feats_length` (B,) int32
    -> `indices` (B, ceil(T / 4)) integers in [0, 6561).

    Average-pools 4 frames into one (25 Hz), projects to 6561 scores with a fixed matrix and takes the
    argmax. `feats_length` is accepted (as by the real model) but unused.
    """
    if index_dtype not in (np.int32, np.int64):
        raise ValueError(f"index_dtype must be np.int32 or np.int64, got {index_dtype}")
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((WHISPER_BINS, SPEECH_CODEBOOK)).astype(np.float32)
    nodes = [
        helper.make_node(
            "AveragePool",
            ["feats"],
            ["pooled"],
            kernel_shape=[FRAMES_PER_TOKEN],
            strides=[FRAMES_PER_TOKEN],
            ceil_mode=1,
        ),
        helper.make_node("Transpose", ["pooled"], ["frames"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["frames", "weight"], ["scores"]),
        helper.make_node("ArgMax", ["scores"], ["codes"], axis=-1, keepdims=0),
    ]
    if index_dtype is np.int32:
        nodes.append(helper.make_node("Cast", ["codes"], ["indices"], to=TensorProto.INT32))
    else:
        nodes.append(helper.make_node("Identity", ["codes"], ["indices"]))
    out_type = TensorProto.INT32 if index_dtype is np.int32 else TensorProto.INT64
    graph = helper.make_graph(
        nodes,
        "speech_tokenizer_standin",
        inputs=[
            helper.make_tensor_value_info("feats", TensorProto.FLOAT, ["B", WHISPER_BINS, "T"]),
            helper.make_tensor_value_info("feats_length", TensorProto.INT32, ["B"]),
        ],
        outputs=[helper.make_tensor_value_info("indices", out_type, ["B", "T_tokens"])],
        initializer=[numpy_helper.from_array(weight, "weight")],
    )
    return _save(graph, path, "cosyserve-standin-speech-tokenizer")
