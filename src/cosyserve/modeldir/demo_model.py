"""`cosyserve demo-model DIR [--size full]`: a random-weight model directory in the official layout.

Everything that needs a model (synthesis, the REST API, the web UI, tests) can run offline on it. The
files are the official ones with small sizes (`--size full`: the real architecture's sizes, 3.7 GB, to
time loading and memory without a download): `cosyvoice3.yaml`, `llm.pt`, `flow.pt`, `hift.pt` (weight
norm stored as g/v pairs), stand-in `campplus.onnx` and `speech_tokenizer_v3.onnx`, and a byte-level BPE
tokenizer in `CosyVoice-BlankEN/` whose special ids match Qwen2's. The same seed writes byte-identical
files. Its audio is noise; `cosyserve_demo.json` marks the directory so the service can say so.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from cosyserve import __version__
from cosyserve.errors import InputError
from cosyserve.frontend.standin_onnx import write_campplus_standin, write_speech_tokenizer_standin
from cosyserve.model.config import CosyVoice3Config, read_cosyvoice3_config
from cosyserve.model.flow import CausalFlow
from cosyserve.model.hift import HiFTVocoder
from cosyserve.model.no_init import NoRandomInit
from cosyserve.model.speech_lm import SpeechLM
from cosyserve.modeldir.demo_files import SIZE_NAMES, DemoSizes, readme_text, sizes_named, yaml_text
from cosyserve.modeldir.demo_tokenizer import FIRST_SPECIAL_ID, tokenizer_files
from cosyserve.modeldir.model_dir import TOKENIZER_DIR

logger = logging.getLogger(__name__)

MARKER_FILE = "cosyserve_demo.json"

# The LM decoder gives logits of std ~DECODER_GAIN, so top-k/top-p sampling has many candidates. Once
# the minimum length (2x the text tokens) has passed, EOS is drawn with about this probability per step:
# sentences end ~25 tokens later on average, well before the 20x maximum.
DECODER_GAIN = 1.5
SHARED_SPEECH_COMPONENT = 0.5  # relative to the per-row spread
EOS_PROB_PER_STEP = 0.04
# The F0 read-out is scaled so the predicted F0 is of speech size (median ~MEDIAN_F0_HZ) with some
# frames under the 10 Hz voiced threshold: both source paths of the vocoder run.
MEDIAN_F0_HZ = 120.0
# Waveform RMS of the demo's noise (about -26 dBFS): audible, far from clipping.
TARGET_RMS = 0.05


def is_demo_model(path: str | Path) -> bool:
    """Whether `path` is a model directory written by `write_demo_model` (random weights, noise audio)."""
    marker = Path(path).expanduser() / MARKER_FILE
    try:
        return json.loads(marker.read_text(encoding="utf-8")).get("demo") is True
    except (OSError, ValueError, AttributeError):
        return False


def write_demo_model(
    path: str | Path,
    seed: int = 0,
    overwrite: bool = False,
    progress: Callable[[str], None] | None = None,
    size: str = "demo",
) -> Path:
    """Write the demo model directory at `path` and return its resolved path (~2 s, ~50 MB; with
    `size="full"` the real architecture's sizes: ~1 min, 3.7 GB, ~4 GB of memory while writing).

    Built in a temporary directory next to `path` and renamed into place at the end, so a failure
    never leaves a half-written model. An existing non-empty directory is refused (InputError) unless
    `overwrite` is set, and even then only an earlier demo model is replaced. `progress` receives one
    line per file written (default: the module logger at INFO level).
    """
    if size not in SIZE_NAMES:
        raise InputError(f"unknown demo model size {size!r}: use one of {', '.join(SIZE_NAMES)}")
    target = Path(path).expanduser().absolute()
    _check_target(target, overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    # Next to the target (same file system: the rename is atomic); mkdir, unlike mkdtemp, honours the umask.
    staging = target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")
    staging.mkdir()
    try:
        _write_all(staging, seed, progress or logger.info, sizes_named(size))
        _move_into_place(staging, target, overwrite)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    (progress or logger.info)(
        f"demo model written to {target} in {time.perf_counter() - started:.1f} s "
        "(random weights: its audio is noise)"
    )
    return target.resolve()


def _check_target(target: Path, overwrite: bool) -> None:
    if target.exists() and not target.is_dir():
        raise InputError(
            f"{target} exists and is not a directory; choose a directory path for the demo model"
        )
    if not target.is_dir() or not any(target.iterdir()):
        return
    if not overwrite:
        raise InputError(
            f"{target} already exists and is not empty; choose another directory or pass --force "
            "to replace an earlier demo model"
        )
    if not is_demo_model(target):
        raise InputError(
            f"{target} is not a cosyserve demo model (no {MARKER_FILE}); refusing to delete it: "
            "choose another directory or remove it yourself"
        )


def _move_into_place(staging: Path, target: Path, overwrite: bool) -> None:
    _check_target(target, overwrite)  # again: the directory may have appeared while we were writing
    old = None
    if target.is_dir():
        old = target.with_name(f".{target.name}.{secrets.token_hex(4)}.old")
        target.rename(old)
    try:
        staging.rename(target)
    except OSError:
        if old is not None:
            old.rename(target)  # put the earlier demo model back
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write_all(root: Path, seed: int, progress: Callable[[str], None], sizes: DemoSizes) -> None:
    def done(name: str) -> None:
        progress(f"wrote {name} ({(root / name).stat().st_size / 1e6:.1f} MB)")

    (root / "cosyvoice3.yaml").write_text(yaml_text(sizes), encoding="utf-8")
    done("cosyvoice3.yaml")
    for name, text in tokenizer_files(sizes.llm_sizes()).items():
        (root / TOKENIZER_DIR).mkdir(exist_ok=True)
        (root / TOKENIZER_DIR / name).write_text(text, encoding="utf-8")
        done(f"{TOKENIZER_DIR}/{name}")
    config = read_cosyvoice3_config(root / "cosyvoice3.yaml", root / TOKENIZER_DIR / "config.json")
    _write_weights(root, config, seed, done)
    write_campplus_standin(root / "campplus.onnx", seed=_sub_seed(seed, "campplus"))
    done("campplus.onnx")
    write_speech_tokenizer_standin(root / "speech_tokenizer_v3.onnx", seed=_sub_seed(seed, "tokenizer"))
    done("speech_tokenizer_v3.onnx")
    (root / "README.md").write_text(readme_text(seed, sizes), encoding="utf-8")
    marker = {"demo": True, "seed": seed, "cosyserve_version": __version__}
    if sizes.name != "demo":
        marker["size"] = sizes.name
    (root / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def _sub_seed(seed: int, part: str) -> int:
    """An independent non-negative seed per file, so one file's shapes never shift another's weights."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{part}".encode()).digest()[:7], "little")


# ---- weights -------------------------------------------------------------------------------------


def _write_weights(root: Path, config: CosyVoice3Config, seed: int, done: Callable[[str], None]) -> None:
    """llm.pt, then flow.pt and hift.pt, under the official key names; one network's weights in memory
    at a time beside its state dict (the full size would otherwise hold ~7 GB)."""
    # Default initialisation would draw from the global RNG and is overwritten anyway: skipped, and the
    # global RNG forked, so callers' draws are unaffected.
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        with NoRandomInit():
            llm = SpeechLM(config.llm)
        _redraw(llm, torch.Generator().manual_seed(_sub_seed(seed, "llm")))
        _calibrate_stop(llm)
        _save(_llm_state(llm), root, "llm.pt", done)
        del llm
        with NoRandomInit():
            flow, hift = CausalFlow(config.flow), HiFTVocoder(config.hift)
        for module, part in ((flow, "flow"), (hift, "hift")):
            _redraw(module, torch.Generator().manual_seed(_sub_seed(seed, part)))
        _calibrate_vocoder(flow, hift)
        _save(_plain_state(flow), root, "flow.pt", done)
        _save(_hift_state(hift), root, "hift.pt", done)


def _save(state: dict[str, Tensor], root: Path, name: str, done: Callable[[str], None]) -> None:
    torch.save(state, root / name)
    done(name)


def _noise(shape: tuple[int, ...] | torch.Size, generator: torch.Generator) -> Tensor:
    """Uniform noise of unit variance, never exactly 0.

    Built from `torch.rand`, whose float32 values are integer-exact, and plain arithmetic: unlike
    `torch.randn` (vectorised log/cos that differ between CPU kinds) it gives the same bits everywhere.
    """
    centred = torch.rand(shape, generator=generator) - 0.5
    centred = torch.where(centred == 0, 0.25, centred)
    return centred * (2 * math.sqrt(3))


def _rounded(value: float | Tensor, step: float = 2**-12) -> Tensor:
    """Calibrated values on a coarse grid, so last-bit differences between machines do not reach the files."""
    return torch.round(torch.as_tensor(value) / step) * step


def _redraw(module: nn.Module, generator: torch.Generator) -> None:
    """Replace every parameter by a non-zero random draw (buffers such as rotary tables stay)."""
    for name, param in module.named_parameters():
        noise = _noise(param.shape, generator)
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "alpha" or (param.dim() == 1 and leaf == "weight"):  # Snake alphas and norm scales
            value = (1.0 + 0.1 * noise).clamp(min=0.5)
        elif leaf == "bias":
            value = 0.05 * noise
        elif isinstance(_owner(module, name), nn.Embedding):
            value = noise
        else:
            fan_in = math.prod(param.shape[1:])
            value = noise / math.sqrt(fan_in)
        param.copy_(value)
    if isinstance(module, SpeechLM):
        module.llm_decoder.weight.mul_(DECODER_GAIN)
        # A component shared by all speech embeddings gives the hidden state a steady direction for the
        # EOS row to read (see `_calibrate_stop`); the rest still varies from token to token.
        shared = _noise((module.config.llm_input_size,), generator)
        module.speech_embedding.weight.add_(SHARED_SPEECH_COMPONENT * shared)


def _owner(module: nn.Module, param_name: str) -> nn.Module:
    return module.get_submodule(param_name.rsplit(".", 1)[0]) if "." in param_name else module


def _calibrate_stop(llm: SpeechLM) -> None:
    """Set the decoder rows of the special ids so that sentences end neither at once nor never.

    The 199 special ids other than EOS would, with random rows, take a few of the top-k places at every
    step and end every sentence as soon as the minimum length allows: their rows are made tiny (logit
    ~0, far below the top-k). The EOS row points along the mean final hidden state, scaled so that EOS
    is drawn with probability ~EOS_PROB_PER_STEP per step, measured by decoding random prompts.
    """
    cfg, sampling = llm.config, llm.config.sampling
    generator = torch.Generator().manual_seed(1)
    weight = llm.llm_decoder.weight  # (codes + 200, H)
    hidden = _decode_hidden_states(llm, generator)  # (N, H)
    special = weight[cfg.speech_token_size :]
    special.copy_(0.01 * _noise(special.shape, generator) / math.sqrt(special.shape[1]))
    code_logits = hidden @ weight[: cfg.speech_token_size].T  # (N, codes)
    code_top = code_logits.topk(sampling.top_k, dim=1).values  # (N, top_k), descending
    code_lse = code_logits.logsumexp(dim=1)  # (N,)
    direction = hidden.mean(dim=0)
    direction = direction / direction.norm()
    projection = hidden @ direction  # (N,)

    def eos_probability(scale: float) -> float:
        eos = scale * projection  # (N,)
        total = torch.logaddexp(code_lse, eos)
        values = torch.cat([code_top, eos[:, None]], dim=1)
        order = values.argsort(dim=1, descending=True, stable=True)[:, : sampling.top_k]
        probs = (values.gather(1, order) - total[:, None]).exp()  # (N, top_k) best candidates
        mass_before = probs.cumsum(dim=1) - probs
        taken = (mass_before < sampling.top_p) | (torch.arange(sampling.top_k) == 0)
        eos_taken = ((order == values.shape[1] - 1) & taken).any(dim=1)
        nucleus = (probs * taken).sum(dim=1)
        return float(torch.where(eos_taken, (eos - total).exp() / nucleus, 0.0).mean())

    low, high = 0.0, 1.0
    while eos_probability(high) < EOS_PROB_PER_STEP and high < 1e4:
        high *= 2
    for _ in range(40):  # bisection: the probability grows with the scale
        middle = (low + high) / 2
        low, high = (middle, high) if eos_probability(middle) < EOS_PROB_PER_STEP else (low, middle)
    weight[cfg.eos] = _rounded(direction) * _rounded(high, 2**-6)


def _decode_hidden_states(
    llm: SpeechLM, generator: torch.Generator, batch: int = 8, steps: int = 40
) -> Tensor:
    """Final hidden states `(batch * steps, H)` of decoding random prompts with top-k sampling."""
    cfg, qwen2 = llm.config, llm.config.qwen2
    text = torch.randint(0, FIRST_SPECIAL_ID, (batch, 12), generator=generator)
    speech = torch.randint(0, cfg.speech_token_size, (batch, 24), generator=generator)
    specials = torch.tensor([[cfg.sos, cfg.task_id]]).expand(batch, 2)
    prefix = torch.cat(
        [
            llm.embed_speech(specials[:, :1]),
            llm.embed_text(text),
            llm.embed_speech(specials[:, 1:]),
            llm.embed_speech(speech),
        ],
        dim=1,
    )
    shape = (qwen2.num_hidden_layers, 2, batch, qwen2.num_key_value_heads, prefix.shape[1] + steps)
    kv = torch.zeros(*shape, qwen2.head_dim)
    last = llm.qwen2(prefix, kv, 0)[:, -1]
    collected = []
    for step in range(steps):
        collected.append(last)
        top = (last @ llm.llm_decoder.weight[: cfg.speech_token_size].T).topk(cfg.sampling.top_k, dim=1)
        choice = torch.multinomial(top.values.softmax(dim=1), 1, generator=generator)
        token = top.indices.gather(1, choice)  # (batch, 1)
        last = llm.qwen2(llm.embed_speech(token), kv, prefix.shape[1] + step)[:, -1]
    return torch.cat(collected)


def _calibrate_vocoder(flow: CausalFlow, hift: HiFTVocoder) -> None:
    """Make the vocoder's noise speech-like in pitch and level, measured on the flow's own mel.

    The F0 read-out is scaled to a median of MEDIAN_F0_HZ; the last conv is scaled so its log-magnitude
    output has unit spread (random deep stacks grow activations, and exp() of them clips), then its
    magnitude bias is shifted until the waveform RMS is about TARGET_RMS.
    """
    generator = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, flow.config.vocab_size, (1, 24), generator=generator)
    prompt_tokens = torch.randint(0, flow.config.vocab_size, (1, 10), generator=generator)
    prompt_mel = _noise((1, 20, flow.config.output_size), generator) - 5.0
    embedding = _noise((1, flow.config.spk_embed_dim), generator)
    mel = flow.inference(tokens, prompt_tokens, prompt_mel, embedding, n_timesteps=4)
    f0 = hift.f0_predictor(mel)
    scale = _rounded(MEDIAN_F0_HZ / float(f0.median()), 2**-6)
    hift.f0_predictor.classifier.weight.mul_(scale)
    hift.f0_predictor.classifier.bias.mul_(scale)

    bins = hift.config.istft_n_fft // 2 + 1
    captured: list[Tensor] = []
    hook = hift.conv_post.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        hift.inference(mel)
    finally:
        hook.remove()
    log_magnitude = captured[0][:, :bins] - hift.conv_post.bias[:bins, None]
    hift.conv_post.weight.mul_(_rounded(1.0 / float(log_magnitude.std()), 2**-10))
    for _ in range(2):  # the level scales with exp(bias) until the clamps bite: two steps settle it
        rms = float(hift.inference(mel)[0].pow(2).mean().sqrt())
        hift.conv_post.bias[:bins] -= _rounded(math.log(rms / TARGET_RMS), 2**-8)


def _plain_state(module: nn.Module) -> dict[str, Tensor]:
    return {key: value.detach().clone().contiguous() for key, value in module.state_dict().items()}


def _llm_state(llm: SpeechLM) -> dict[str, Tensor]:
    """`llm.model.model.*`, the tied text LM head, `llm_decoder`, `speech_embedding` (official order)."""
    state = _plain_state(llm)
    out = {
        f"llm.model.model.{k.removeprefix('qwen2.')}": v for k, v in state.items() if k.startswith("qwen2.")
    }
    # Qwen2-0.5B ties the text LM head to embed_tokens: one storage, saved once.
    out = _in_official_order(out)
    out["llm.model.lm_head.weight"] = out["llm.model.model.embed_tokens.weight"]
    out["llm_decoder.weight"] = state["llm_decoder.weight"]
    out["speech_embedding.weight"] = state["speech_embedding.weight"]
    return out


def _hift_state(hift: HiFTVocoder) -> dict[str, Tensor]:
    """Weight-normed convs as the official `parametrizations.weight.original0/1` (g, v) pairs."""
    normed = {
        name
        for name, module in hift.named_modules()
        if isinstance(module, nn.Conv1d)
        and not name.startswith("source_downs")  # plain convs in the official generator
    }
    out: dict[str, Tensor] = {}
    for key, value in _plain_state(hift).items():
        prefix, leaf = key.rsplit(".", 1)
        if prefix in normed and leaf == "weight":
            continue
        if prefix in normed and leaf == "bias":
            weight = hift.get_submodule(prefix).weight.detach().clone()
            out[key] = value
            # g = ||v|| over all dims but 0, summed in float64 so the rounded result is the same everywhere
            norm = weight.double().norm(dim=tuple(range(1, weight.dim())), keepdim=True)
            out[f"{prefix}.parametrizations.weight.original0"] = norm.float()
            out[f"{prefix}.parametrizations.weight.original1"] = weight
        else:
            out[key] = value
    return _in_official_order(out)


# Sub-module order of the official classes (their state dicts list keys in this order; ours differ).
_OFFICIAL_ORDER = (
    *("m_source", "conv_pre", "ups", "source_downs", "source_resblocks", "resblocks", "conv_post"),
    *("f0_predictor", "self_attn", "mlp", "input_layernorm", "post_attention_layernorm"),
)


def _in_official_order(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Reorder keys: siblings named in _OFFICIAL_ORDER come first, in its order; the rest keep theirs."""
    first_seen: dict[tuple[str, ...], int] = {}
    for key in state:
        parts = tuple(key.split("."))
        for depth in range(1, len(parts) + 1):
            first_seen.setdefault(parts[:depth], len(first_seen))

    def rank(key: str) -> list[int]:
        parts = tuple(key.split("."))
        return [
            _OFFICIAL_ORDER.index(part) - len(_OFFICIAL_ORDER)
            if part in _OFFICIAL_ORDER
            else first_seen[parts[: depth + 1]]
            for depth, part in enumerate(parts)
        ]

    return dict(sorted(state.items(), key=lambda item: rank(item[0])))
