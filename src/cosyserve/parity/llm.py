"""Parity of the speech LM against `llm.npz` (and the LM hidden states in `debug.npz`).

The prefix is embedded and prefilled in one call, then `forced_tokens` are fed one at a time through
the KV cache, exactly the path generation takes; `logp[i]` is compared after `forced_tokens[:i]`.

Known fixture defect: the shipped `llm.npz` was produced with transformers >= 4.56, where the official
decode step's 2-D attention mask of length 1 is right-padded with False, so every decode step attends
to position 0 (sos) only. With the official pin (transformers 4.51.3) that mask is dropped and decode
attends to the whole cache, which is what the model was trained for and what cosyserve does. Only
`logp[0]` (the prefill) is independent of this. The "decode vs fixture" check therefore accepts the
fixture in either form: matched directly (a fixture regenerated with 4.51.3), or matched by an
emulation of the padded mask, in which case its detail says so. Correct decoding itself is checked
against one uncached pass over the same sequence ("decode vs full pass").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from cosyserve.engine.kv_cache import KVCache
from cosyserve.engine.model_dir import ModelDir
from cosyserve.engine.speech_lm_runner import decode_one, prefill
from cosyserve.model.speech_lm import SpeechLM
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
        results.append(_decode_vs_fixture(model, lm_input, forced, logp, expected_logp))
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


def padded_mask_decode_logp(
    model: SpeechLM, lm_input: torch.Tensor, forced_tokens: torch.Tensor
) -> torch.Tensor:
    """Emulate decode steps that attend to position 0 only (the transformers >= 4.56 fixture defect).

    Attention over a single key returns that key's value, so each layer adds `o_proj(v_0)`; queries,
    keys and rotary play no part. Row 0 is the ordinary prefill. Returns `(N, V)`.
    """
    cache = _cache_for(model, lm_input.shape[1])
    rows = [prefill(model, lm_input, cache)[0]]
    qwen2 = model.qwen2
    for token in forced_tokens[:-1].tolist():
        x = model.embed_speech(torch.tensor([[token]], device=lm_input.device))
        for index, layer in enumerate(qwen2.layers):
            attn = layer.self_attn
            first_value = cache.buffer[index, 1, :, :, 0]  # (B, kv_heads, head_dim)
            per_head = first_value.repeat_interleave(attn.num_heads // attn.num_kv_heads, dim=1)
            x = x + attn.o_proj(per_head.reshape(x.shape[0], 1, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        rows.append(model.llm_decoder(qwen2.norm(x)[:, -1]).float().log_softmax(dim=-1)[0])
    return torch.stack(rows).float().cpu()


def _decode_vs_fixture(
    model: SpeechLM, lm_input: torch.Tensor, forced: torch.Tensor, logp: np.ndarray, expected: np.ndarray
) -> CheckResult:
    name = "llm logp decode vs fixture"
    direct = compare(name, logp[1:], expected[1:], LOGP_TOLERANCE)
    if direct.passed:
        return direct
    emulated = padded_mask_decode_logp(model, lm_input, forced).numpy()
    quirk = compare(name, emulated[1:], expected[1:], LOGP_TOLERANCE)
    if not quirk.passed:
        return direct
    return CheckResult(
        name,
        quirk.max_abs_diff,
        LOGP_TOLERANCE,
        "fixture was made with transformers >= 4.56 (decode attends to position 0 only); it matches that "
        f"emulation; cosyserve's full-attention decode differs from it by {direct.max_abs_diff:.3g}. "
        "Regenerate llm.npz with transformers 4.51.3 (the official pin) for a direct comparison",
    )


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
