#!/usr/bin/env python3
"""Time the official CosyVoice3 code on random full-size weights, called the way its own runtime calls it.

This is the "official" column of cosyserve's performance table, reproducible on your machine. It runs
in an environment with the official requirements (torch, transformers 4.51.3, HyperPyYAML,
x-transformers, einops, omegaconf, conformer, diffusers, lightning, hydra-core, rich, gdown,
matplotlib, wget, scipy; lightning 2.2.4 also needs setuptools < 81 for `pkg_resources`), never in
cosyserve's, and nothing in cosyserve imports it:

    python scripts/bench_official.py --official-repo ~/src/CosyVoice \\
        --matcha-repo ~/src/CosyVoice/third_party/Matcha-TTS --threads 2 --case nonstream

What it does:
- Builds `llm`, `flow` and `hift` from the official CosyVoice3 YAML (by default the repository's
  `examples/libritts/cosyvoice3/conf/cosyvoice3.yaml`; `--config` takes a model directory's
  `cosyvoice3.yaml`), keeping only the fixed parameters and those three sections, so no tokenizer,
  feature extractor or training pipeline is built. The Qwen2 inside the LM is built from the
  Qwen2-0.5B configuration below (or `--qwen-config`) with random weights instead of downloaded ones.
  All weights are the official modules' own random initialisation: float32, eval mode.
- Feeds the input cosyserve's bench uses: a prompt of `--prompt-seconds` (25 speech tokens and 50 mel
  frames per second, a 192-d embedding), a prompt text of one token per 5 prompt speech tokens ending in
  <|endofprompt|>, and a text of one token per 5 speech tokens to generate.
- Times the official entry points (`--case`, one per process gives a clean peak RSS):
  `nonstream` and `stream`: one utterance through `CosyVoice3Model.tts`, the method
  `CosyVoice3.inference_zero_shot` drives (the LM in its own thread; when streaming, chunks are
  synthesised while the LM goes on decoding, so both share the cores, as in the official server).
  `stream-first`: the first streamed chunk alone, sequentially: `CosyVoice3LM.inference` up to the
  first hop (token_hop_len + prompt padding + pre-lookahead, computed as `tts` does), then
  `CosyVoice3Model.token2wav(stream=True, finalize=False)`.
  The stages are timed by thin wrappers around `llm.inference`, `flow.inference` and `hift.inference`;
  `other_processes_cpu_share` (Linux) says how much CPU other processes took during each timed run.

Deviations from a real run, none of which changes the work timed:
- Exactly `--audio-seconds * 25` speech tokens: the LM's `inference_wrapper` is called with
  min_len = max_len = that count and `sampling_ids` masks every stop id (the official code masks only
  one of them), so random weights cannot end the utterance early. Sampling itself (`ras_sampling`)
  is unchanged.
- torchaudio (and onnxruntime) are only imported, never used, by the modules timed here; where they
  are missing (there is no torchaudio build for every torch) a stub module is put in `sys.modules`.
  The stub records any use of its names (a call or a read from one; importing a name is not a use),
  and the report's `stub_uses` lists them: it must stay empty.
- One short warm-up pass through each network before timing (as `cosyserve bench` does).
- `stream-first` skips `llm_job`'s filter of long runs of silence tokens (more than 5 in a row are
  dropped); with random weights such runs practically never occur (`tokens_to_flow` shows the count
  the flow received in the other cases).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import math
import os
import platform
import re
import resource
import sys
import tempfile
import time
import types
import uuid as uuid_lib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

SPEECH_TOKENS_PER_TEXT_TOKEN = 5  # as cosyserve's bench: ~5 speech tokens (0.2 s) per BPE token
ENDOFPROMPT_ID = 151646  # <|endofprompt|>, required in the text by CosyVoice3LM
FIRST_SPECIAL_TEXT_ID = 151643
TOKEN_RATE = 25
MEL_PER_TOKEN = 2
# Qwen2-0.5B, the base of CosyVoice-BlankEN (the LM inside Fun-CosyVoice3-0.5B).
QWEN2_0_5B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "use_sliding_window": False,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
    "torch_dtype": "float32",
}
# The YAML's fixed parameters and the three networks; everything else (tokenizer, feature extraction,
# the GAN and its discriminators, training pipeline) is not needed for inference timing.
CONFIG_KEYS = (
    "sample_rate",
    "llm_input_size",
    "llm_output_size",
    "spk_embed_dim",
    "qwen_pretrain_path",
    "token_frame_rate",
    "token_mel_ratio",
    "chunk_size",
    "num_decoding_left_chunks",
    "llm",
    "flow",
    "hift",
)
CASES = ("nonstream", "stream-first", "stream")
STUB_USES: list[str] = []


class _StubName:
    """A name imported from a stub (`from onnxruntime import InferenceSession` runs at import time in
    newer official code): importing it is harmless, calling it or reading from it is a use."""

    def __init__(self, qualified: str) -> None:
        self._qualified = qualified

    def _used(self) -> RuntimeError:
        STUB_USES.append(self._qualified)
        return RuntimeError(f"{self._qualified} is a stub in bench_official.py and was used")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._used()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise self._used()


class _StubModule(types.ModuleType):
    """Importable stand-in for a package the timed code never calls; records any use of its names."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubName(f"{self.__name__}.{name}")


def install_import_stubs() -> list[str]:
    """Stub torchaudio / onnxruntime (and their submodules the official code imports) when missing."""
    wanted = {"torchaudio": ("compliance", "compliance.kaldi", "transforms"), "onnxruntime": ()}
    stubbed = []
    for top, subs in wanted.items():
        try:
            __import__(top)
            continue
        except ImportError:
            pass
        for name in (top, *(f"{top}.{sub}" for sub in subs)):
            module = _StubModule(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            module.__path__ = []
            sys.modules[name] = module
            parent, _, leaf = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], leaf, module)
        stubbed.append(top)
    return stubbed


def reduced_config(path: Path) -> str:
    """The YAML's top-level blocks named in CONFIG_KEYS, verbatim."""
    blocks: dict[str, list[str]] = {}
    current = None
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z_][\w]*)\s*:", line)
        if match:
            current = match.group(1)
            blocks[current] = []
        if current is not None:
            blocks[current].append(line)
    missing = [key for key in CONFIG_KEYS if key not in blocks]
    if missing:
        raise SystemExit(f"{path} lacks {', '.join(missing)}: pass a CosyVoice3 YAML with --config")
    return "\n".join(line for key in CONFIG_KEYS for line in blocks[key]) + "\n"


@dataclass
class Models:
    llm: torch.nn.Module
    flow: torch.nn.Module
    hift: torch.nn.Module
    attn_implementation: str


def build_models(config_path: Path, qwen_config: dict[str, Any], seed: int) -> Models:
    """The official modules from the official YAML, with random weights (the modules' own init)."""
    import cosyvoice.llm.llm as official_llm
    import transformers
    from hyperpyyaml import load_hyperpyyaml

    class _RandomQwen2:
        """Stands in for Qwen2ForCausalLM in the official LM module: same class, weights not loaded."""

        @staticmethod
        def from_pretrained(path: str) -> torch.nn.Module:
            config = transformers.AutoConfig.from_pretrained(path)
            return transformers.Qwen2ForCausalLM._from_config(config, torch_dtype=torch.float32)

    official_llm.Qwen2ForCausalLM = _RandomQwen2
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory(prefix="bench-official-qwen-") as qwen_dir:
        Path(qwen_dir, "config.json").write_text(json.dumps(qwen_config), encoding="utf-8")
        configs = load_hyperpyyaml(reduced_config(config_path), overrides={"qwen_pretrain_path": qwen_dir})
    llm, flow, hift = (configs[key].float().eval() for key in ("llm", "flow", "hift"))
    attn = llm.llm.model.config._attn_implementation
    return Models(llm, flow, hift, attn)


def parameter_counts(models: Models) -> dict[str, int]:
    """Parameters per network; tied Qwen embeddings / LM head count once (as `parameters()` does).

    `hift_folded` counts HiFT with its weight-norm magnitudes folded into the weights, i.e. the
    number of values a checkpoint-converting engine holds.
    """

    def count(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    qwen = models.llm.llm.model
    counts = {
        "llm": count(models.llm),
        "llm_text_lm_head_tied": int(qwen.lm_head.weight is qwen.model.embed_tokens.weight),
        "flow": count(models.flow),
        "hift": count(models.hift),
    }
    magnitudes = sum(
        p.numel()
        for name, p in models.hift.named_parameters()
        if name.endswith("parametrizations.weight.original0")
    )
    counts["hift_folded"] = counts["hift"] - magnitudes
    return counts


@dataclass
class Inputs:
    text: torch.Tensor  # (1, Tt) int32
    prompt_text: torch.Tensor  # (1, Tpt) int32, ends in <|endofprompt|>
    prompt_token: torch.Tensor  # (1, P) int32
    prompt_feat: torch.Tensor  # (1, 2P, 80)
    embedding: torch.Tensor  # (1, 192)
    speech_tokens: int


def make_inputs(prompt_seconds: float, audio_seconds: float, seed: int) -> Inputs:
    generator = torch.Generator().manual_seed(seed)
    prompt_tokens = max(1, round(prompt_seconds * TOKEN_RATE))
    speech_tokens = max(1, round(audio_seconds * TOKEN_RATE))
    n_prompt_text = math.ceil(prompt_tokens / SPEECH_TOKENS_PER_TEXT_TOKEN)
    prompt_text = torch.randint(0, FIRST_SPECIAL_TEXT_ID, (n_prompt_text,), generator=generator)
    prompt_text = torch.cat([prompt_text, torch.tensor([ENDOFPROMPT_ID])])
    n_text = math.ceil(speech_tokens / SPEECH_TOKENS_PER_TEXT_TOKEN)
    text = torch.randint(0, FIRST_SPECIAL_TEXT_ID, (n_text,), generator=generator)
    return Inputs(
        text=text[None].to(torch.int32),
        prompt_text=prompt_text[None].to(torch.int32),
        prompt_token=torch.randint(0, 6561, (1, prompt_tokens), generator=generator).to(torch.int32),
        # A log-mel of speech lies roughly in [-11, 2]; values in that range cost the same as real ones.
        prompt_feat=torch.randn(1, prompt_tokens * MEL_PER_TOKEN, 80, generator=generator) * 2 - 5,
        embedding=torch.randn(1, 192, generator=generator),
        speech_tokens=speech_tokens,
    )


def force_token_count(llm: torch.nn.Module, count: int) -> None:
    """Make the official decode loop produce exactly `count` tokens (see the module docstring)."""
    wrapper = type(llm).inference_wrapper
    sampling_ids = type(llm).sampling_ids
    first_stop = llm.speech_token_size

    def inference_wrapper(lm_input, sampling, min_len, max_len, uuid):  # type: ignore[no-untyped-def]
        return wrapper(llm, lm_input, sampling, count, count, uuid)

    def masked_sampling_ids(weighted_scores, decoded_tokens, sampling, ignore_eos=True):  # type: ignore[no-untyped-def]
        weighted_scores[first_stop:] = -float("inf")
        return sampling_ids(llm, weighted_scores, decoded_tokens, sampling, ignore_eos=ignore_eos)

    llm.inference_wrapper = inference_wrapper
    llm.sampling_ids = masked_sampling_ids


@dataclass
class Recorder:
    """Wall-clock marks taken by the wrappers around the three official entry points."""

    llm_start: float | None = None
    token_times: list[float] = field(default_factory=list)
    flow_calls: list[dict[str, Any]] = field(default_factory=list)
    hift_calls: list[dict[str, Any]] = field(default_factory=list)

    def reset(self) -> None:
        self.llm_start = None
        self.token_times, self.flow_calls, self.hift_calls = [], [], []


def instrument(models: Models, recorder: Recorder) -> None:
    llm_inference = models.llm.inference
    flow_inference = models.flow.inference
    hift_inference = models.hift.inference

    def timed_llm(*args: Any, **kwargs: Any) -> Iterator[int]:
        recorder.llm_start = time.perf_counter()
        for token in llm_inference(*args, **kwargs):
            recorder.token_times.append(time.perf_counter())
            yield token

    def timed_flow(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = flow_inference(*args, **kwargs)
        recorder.flow_calls.append(
            {
                "tokens": int(kwargs["token"].shape[1]),
                "streaming": bool(kwargs["streaming"]),
                "finalize": bool(kwargs["finalize"]),
                "seconds": time.perf_counter() - start,
                "start": start,
            }
        )
        return out

    def timed_hift(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = hift_inference(*args, **kwargs)
        recorder.hift_calls.append(
            {
                "mel_frames": int(kwargs["speech_feat"].shape[2]),
                "seconds": time.perf_counter() - start,
                "start": start,
            }
        )
        return out

    models.llm.inference = timed_llm
    models.flow.inference = timed_flow
    models.hift.inference = timed_hift


def llm_kwargs(inputs: Inputs, uuid: str) -> dict[str, Any]:
    """The arguments `CosyVoice3Model.llm_job` passes to `llm.inference`."""
    return {
        "text": inputs.text,
        "text_len": torch.tensor([inputs.text.shape[1]], dtype=torch.int32),
        "prompt_text": inputs.prompt_text,
        "prompt_text_len": torch.tensor([inputs.prompt_text.shape[1]], dtype=torch.int32),
        "prompt_speech_token": inputs.prompt_token,
        "prompt_speech_token_len": torch.tensor([inputs.prompt_token.shape[1]], dtype=torch.int32),
        "embedding": inputs.embedding,
        "uuid": uuid,
    }


def warm_up(models: Models, inputs: Inputs) -> None:
    """A few positions through each network, so first-call allocations are not timed."""
    force_token_count(models.llm, 2)
    short = Inputs(
        inputs.text[:, :2],
        inputs.prompt_text[:, -2:],
        inputs.prompt_token[:, :2],
        inputs.prompt_feat[:, :4],
        inputs.embedding,
        2,
    )
    for _ in models.llm.inference(**llm_kwargs(short, "warm-up")):
        pass
    mel, _ = models.flow.inference(
        token=inputs.prompt_token[:, :4],
        token_len=torch.tensor([4], dtype=torch.int32),
        prompt_token=short.prompt_token,
        prompt_token_len=torch.tensor([2], dtype=torch.int32),
        prompt_feat=short.prompt_feat,
        prompt_feat_len=torch.tensor([4], dtype=torch.int32),
        embedding=inputs.embedding,
        streaming=False,
        finalize=True,
    )
    models.hift.inference(speech_feat=mel, finalize=True)


def tts_kwargs(inputs: Inputs, stream: bool) -> dict[str, Any]:
    """What `CosyVoice3.inference_zero_shot` passes to `CosyVoice3Model.tts` (frontend output)."""
    return {
        "text": inputs.text,
        "flow_embedding": inputs.embedding,
        "llm_embedding": inputs.embedding,
        "prompt_text": inputs.prompt_text,
        "llm_prompt_speech_token": inputs.prompt_token,
        "flow_prompt_speech_token": inputs.prompt_token,
        "prompt_speech_feat": inputs.prompt_feat,
        "stream": stream,
    }


def new_runtime(models: Models) -> Any:
    """A fresh CosyVoice3Model: its `tts` grows `token_hop_len` in place, so one per utterance."""
    from cosyvoice.cli.model import CosyVoice3Model

    return CosyVoice3Model(models.llm, models.flow, models.hift, fp16=False)


def _llm_figures(recorder: Recorder, start: float) -> dict[str, Any]:
    times = recorder.token_times
    if recorder.llm_start is None or not times:
        raise RuntimeError("the official LM produced no token: nothing to time")
    llm_seconds = times[-1] - recorder.llm_start
    return {
        "speech_tokens": len(times),
        "first_token_seconds": times[0] - recorder.llm_start,
        "llm_seconds": llm_seconds,
        "llm_tokens_per_second": len(times) / llm_seconds,
        "decode_tokens_per_second": (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else None,
        "llm_start_after_call_seconds": recorder.llm_start - start,
    }


def run_tts(models: Models, inputs: Inputs, recorder: Recorder, stream: bool) -> dict[str, Any]:
    """One utterance through `CosyVoice3Model.tts`, as `inference_zero_shot` drives it."""
    runtime = new_runtime(models)
    recorder.reset()
    chunk_times, samples = [], 0
    start = time.perf_counter()
    cpu_start = time.process_time()
    for out in runtime.tts(**tts_kwargs(inputs, stream)):
        chunk_times.append(time.perf_counter() - start)
        samples += int(out["tts_speech"].shape[1])
    total = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    audio_seconds = samples / 24000
    report = {
        **_llm_figures(recorder, start),
        "flow_seconds": sum(c["seconds"] for c in recorder.flow_calls),
        "vocoder_seconds": sum(c["seconds"] for c in recorder.hift_calls),
        "total_seconds": total,
        "audio_out_seconds": audio_seconds,
        "real_time_factor": total / audio_seconds,
        "cpu_share": cpu / (total * torch.get_num_threads()),
        "tokens_to_flow": sum(c["tokens"] for c in recorder.flow_calls[-1:]),
        "chunks": len(chunk_times),
        "chunk_seconds": chunk_times,
        "flow_calls": [{k: v for k, v in c.items() if k != "start"} for c in recorder.flow_calls],
        "hift_calls": [{k: v for k, v in c.items() if k != "start"} for c in recorder.hift_calls],
    }
    if stream:
        report["first_chunk_seconds"] = chunk_times[0]
        first_flow = recorder.flow_calls[0]
        tokens_needed = first_flow["tokens"]
        report["first_chunk_tokens"] = tokens_needed
        report["first_chunk_llm_seconds"] = recorder.token_times[tokens_needed - 1] - start
        report["first_chunk_flow_seconds"] = first_flow["seconds"]
        report["first_chunk_vocoder_seconds"] = recorder.hift_calls[0]["seconds"]
    return report


def run_stream_first(models: Models, inputs: Inputs, recorder: Recorder) -> dict[str, Any]:
    """The first streamed chunk alone: LM prefill and the first hop's tokens, then `token2wav(stream=True)`.

    The hop is computed as `CosyVoice3Model.tts` computes it (token_hop_len, the prompt padding to a
    whole hop, and the flow's pre-lookahead); the LM is stopped once it has produced those tokens, so
    the flow and vocoder run alone, as in a single-threaded server.
    """
    runtime = new_runtime(models)
    recorder.reset()
    prompt_len = inputs.prompt_token.shape[1]
    hop = runtime.token_hop_len
    prompt_pad = int(math.ceil(prompt_len / hop) * hop - prompt_len)
    needed = hop + prompt_pad + models.flow.pre_lookahead_len
    this_uuid = str(uuid_lib.uuid1())
    runtime.hift_cache_dict[this_uuid] = None
    start = time.perf_counter()
    cpu_start = time.process_time()
    tokens = []
    generator = models.llm.inference(**llm_kwargs(inputs, this_uuid))
    for token in generator:
        tokens.append(token)
        if len(tokens) == needed:
            break
    generator.close()
    llm_done = time.perf_counter()
    speech = runtime.token2wav(
        token=torch.tensor(tokens).unsqueeze(dim=0),
        prompt_token=inputs.prompt_token,
        prompt_feat=inputs.prompt_feat,
        embedding=inputs.embedding,
        token_offset=0,
        uuid=this_uuid,
        stream=True,
        finalize=False,
    )
    total = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    return {
        "first_chunk_tokens": needed,
        "first_chunk_seconds": total,
        "cpu_share": cpu / (total * torch.get_num_threads()),
        "first_token_seconds": recorder.token_times[0] - recorder.llm_start,
        "first_chunk_llm_seconds": llm_done - start,
        "first_chunk_flow_seconds": recorder.flow_calls[0]["seconds"],
        "first_chunk_vocoder_seconds": recorder.hift_calls[0]["seconds"],
        "first_chunk_audio_seconds": int(speech.shape[1]) / 24000,
    }


def machine(threads: int) -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "threads": threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--official-repo", type=Path, required=True, help="a checkout of FunAudioLLM/CosyVoice"
    )
    parser.add_argument("--matcha-repo", type=Path, required=True, help="a checkout of Matcha-TTS")
    parser.add_argument("--config", type=Path, help="a CosyVoice3 YAML (default: the repository's example)")
    parser.add_argument("--qwen-config", type=Path, help="a Qwen2 config.json (default: Qwen2-0.5B's)")
    parser.add_argument("--case", choices=[*CASES, "all"], default="all")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all)")
    parser.add_argument("--prompt-seconds", type=float, default=6.0)
    parser.add_argument("--audio-seconds", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-warmup", action="store_true")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        metavar="LOAD",
        help="before each timed case, wait until the 1-minute load average is below LOAD",
    )
    parser.add_argument("--wait-max", type=float, default=1500.0, help="longest such wait, seconds")
    args = parser.parse_args(argv)

    stubbed = install_import_stubs()
    sys.path[:0] = [str(args.official_repo.resolve()), str(args.matcha_repo.resolve())]
    if args.threads:
        torch.set_num_threads(args.threads)
    config_path = args.config or args.official_repo / "examples/libritts/cosyvoice3/conf/cosyvoice3.yaml"
    qwen_config = json.loads(args.qwen_config.read_text()) if args.qwen_config else QWEN2_0_5B
    load_start = os.getloadavg()

    started = time.perf_counter()
    progress("building the official modules")
    models = build_models(config_path, qwen_config, args.seed)
    build_seconds = time.perf_counter() - started
    inputs = make_inputs(args.prompt_seconds, args.audio_seconds, args.seed)
    recorder = Recorder()
    instrument(models, recorder)
    weights = sum(
        t.numel() * t.element_size()
        for m in (models.llm, models.flow, models.hift)
        for t in [*m.parameters(), *m.buffers()]
    )
    if not args.no_warmup:
        progress("warm-up")
        warm_up(models, inputs)
    force_token_count(models.llm, inputs.speech_tokens)

    cases = CASES if args.case == "all" else (args.case,)
    results: dict[str, Any] = {}
    # No inference_mode here: the official entry points carry their own, and `tts` runs without one.
    for case in cases:
        torch.manual_seed(args.seed)
        waited = wait_quiet(args.wait_quiet, args.wait_max) if args.wait_quiet else 0.0
        case_load = os.getloadavg()
        progress(f"timing {case} (load average {case_load[0]:.2f}, waited {waited:.0f} s)")
        counters, wall_start = cpu_counters(), time.time()
        if case == "stream-first":
            result = run_stream_first(models, inputs, recorder)
        else:
            result = run_tts(models, inputs, recorder, stream=case == "stream")
        result["started_at"], result["ended_at"] = wall_start, time.time()
        result["other_processes_cpu_share"] = other_cpu_share(counters, result["ended_at"] - wall_start)
        result["load_average_before"] = case_load
        result["load_average_after"] = os.getloadavg()
        result["waited_for_quiet_seconds"] = waited
        result["peak_rss_bytes_so_far"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        results[case] = result
        progress(f"{case}: {json.dumps(_headline(result))}")

    report = {
        "implementation": "official CosyVoice3 (FunAudioLLM/CosyVoice)",
        "config": str(config_path),
        "weights": "random (the official modules' own initialisation), float32",
        "attn_implementation": models.attn_implementation,
        "parameters": parameter_counts(models),
        "weights_bytes": weights,
        "build_seconds": build_seconds,
        "prompt_speech_tokens": int(inputs.prompt_token.shape[1]),
        "prompt_text_tokens": int(inputs.prompt_text.shape[1]),
        "text_tokens": int(inputs.text.shape[1]),
        "lm_prefix_positions": 2
        + int(inputs.prompt_text.shape[1] + inputs.text.shape[1])
        + int(inputs.prompt_token.shape[1]),
        "forced_speech_tokens": inputs.speech_tokens,
        "warmup": not args.no_warmup,
        "stubbed_imports": stubbed,
        "stub_uses": sorted(set(STUB_USES)),
        "cases": results,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "machine": {**machine(torch.get_num_threads()), "load_average_at_start": load_start},
    }
    print(json.dumps(report, indent=2))
    return 0


def progress(message: str) -> None:
    print(f"[bench_official {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cpu_counters() -> tuple[float, float] | None:
    """(CPU seconds the whole machine has been busy, CPU seconds of this process); None off Linux."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    return busy, time.process_time()


def other_cpu_share(before: tuple[float, float] | None, wall: float) -> float | None:
    """Share of the machine's CPU that other processes used during a timed run: 0 means undisturbed."""
    after = cpu_counters()
    if before is None or after is None or wall <= 0:
        return None
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, others) / (wall * (os.cpu_count() or 1))


def wait_quiet(limit: float, longest: float) -> float:
    """Sleep until the 1-minute load average is below `limit` (at most `longest` s); seconds waited."""
    start = time.monotonic()
    while os.getloadavg()[0] >= limit and time.monotonic() - start < longest:
        progress(f"waiting for the load average ({os.getloadavg()[0]:.2f}) to fall below {limit}")
        time.sleep(30)
    return time.monotonic() - start


def _headline(result: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "first_token_seconds",
        "llm_tokens_per_second",
        "flow_seconds",
        "vocoder_seconds",
        "total_seconds",
        "real_time_factor",
        "first_chunk_seconds",
    )
    return {k: round(result[k], 3) for k in keys if isinstance(result.get(k), float)}


if __name__ == "__main__":
    sys.exit(main())
