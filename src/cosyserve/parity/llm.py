"""Parity of the speech LM against `llm.npz` (and the LM hidden states in `debug.npz`).

The prefix is embedded and prefilled in one call, then `forced_tokens` are fed one at a time through
the KV cache, exactly the path generation takes; `logp[i]` is compared after `forced_tokens[:i]`.
The fixture was made under transformers 4.51.3 (the official pin), where each decode step attends to
the whole cache, as cosyserve's does. The cached decode is also checked against one uncached pass
over the same sequence ("decode vs full pass"), which tells a cache bug apart from a model bug.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from cosyserve.engine.kv_cache import KVCache
from cosyserve.engine.speech_lm_runner import decode_one, prefill
from cosyserve.model.speech_lm import SpeechLM
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity import CheckResult, compare

EMBEDDING_TOLERANCE = 1e-5  # lm_input rows are copies of embedding rows
LOGP_TOLERANCE = 1e-4
HIDDEN_TOLERANCE = 1e-4


def run(model_dir: ModelDir | str | Path, fixture_dir: Path) -> list[CheckResult]:
    """Compare lm_input, the teacher-forced logp rows and the prefix hidden states with the fixtures."""
    if not isinstance(model_dir, ModelDir):
        model_dir = ModelDir.open(model_dir, require_onnx=False)
    fixture_dir = Path(fixture_dir)
    golden = np.load(fixture_dir / "llm.npz")
    model = SpeechLM.from_checkpoint(model_dir.file("llm.pt"), model_dir.config.llm)
    forced = torch.from_numpy(golden["forced_tokens"]).long()
    expected_logp = golden["logp"]
    results = []
    with torch.inference_mode():
        lm_input = model.embed_prefix(
            torch.from_numpy(golden["prompt_text"]),
            torch.from_numpy(golden["text"]),
            torch.from_numpy(golden["prompt_speech_token"]),
        )
        results.append(compare("llm lm_input", lm_input[0].numpy(), golden["lm_input"], EMBEDDING_TOLERANCE))
        logp = teacher_forced_logp(model, lm_input, forced).numpy()
        results.append(compare("llm logp prefill", logp[:1], expected_logp[:1], LOGP_TOLERANCE))
        full = full_pass_logp(model, lm_input, forced).numpy()
        results.append(compare("llm logp decode vs full pass", logp, full, LOGP_TOLERANCE))
        results.append(compare("llm logp decode vs fixture", logp[1:], expected_logp[1:], LOGP_TOLERANCE))
        debug_path = fixture_dir / "debug.npz"
        if debug_path.is_file():
            results.extend(_hidden_state_checks(model, lm_input, np.load(debug_path)))
    return results


def teacher_forced_logp(model: SpeechLM, lm_input: torch.Tensor, forced_tokens: torch.Tensor) -> torch.Tensor:
    """Log-probs `(N, V)`: row i after prefilling `lm_input` `(1, L, H)` then decoding `forced_tokens[:i]`."""
    cache = _cache_for(model, lm_input.shape[1] + len(forced_tokens))
    device = model.speech_embedding.weight.device
    rows = [prefill(model, lm_input, cache)[0]]
    for token in forced_tokens[:-1].tolist():
        rows.append(decode_one(model, torch.tensor([token], device=device), cache)[0])
    return torch.stack(rows).float().cpu()


def full_pass_logp(model: SpeechLM, lm_input: torch.Tensor, forced_tokens: torch.Tensor) -> torch.Tensor:
    """The same `(N, V)` rows from one causal pass over `lm_input ++ forced_tokens[:-1]`, no cache reuse."""
    tokens = forced_tokens[:-1].to(lm_input.device)[None]
    embeds = torch.cat([lm_input, model.embed_speech(tokens)], dim=1)
    cache = _cache_for(model, embeds.shape[1])
    hidden = model.qwen2(embeds, cache.buffer, cache.reserve(embeds.shape[1]))
    rows = hidden[0, lm_input.shape[1] - 1 :]
    return model.llm_decoder(rows).float().log_softmax(dim=-1).cpu()


def _hidden_state_checks(
    model: SpeechLM, lm_input: torch.Tensor, debug: np.lib.npyio.NpzFile
) -> list[CheckResult]:
    keys = sorted(
        (k for k in debug.files if k.startswith("llm_hidden_states_")), key=lambda k: int(k.rsplit("_", 1)[1])
    )
    if not keys:
        return []
    cache = _cache_for(model, lm_input.shape[1])
    hidden: list[torch.Tensor] = []
    model(lm_input, cache.buffer, cache.reserve(lm_input.shape[1]), hidden_states=hidden)
    if len(hidden) != len(keys):
        return [CheckResult("llm hidden state count", float("inf"), 0.0, f"{len(hidden)} != {len(keys)}")]
    return [
        compare(f"llm {key}", state[0].float().cpu().numpy(), debug[key], HIDDEN_TOLERANCE)
        for key, state in zip(keys, hidden, strict=True)
    ]


def _cache_for(model: SpeechLM, capacity: int) -> KVCache:
    weight = model.speech_embedding.weight
    return KVCache.allocate(model.config.qwen2, capacity, device=weight.device, dtype=weight.dtype)
