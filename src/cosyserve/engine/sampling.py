"""Repetition-aware sampling of speech tokens, with a random generator owned by each request.

The rule (CosyVoice's `ras_sampling`):
1. nucleus draw: take tokens in descending probability (stable order) while the mass taken so far is
   below `top_p` and fewer than `top_k` are taken, then draw one of them proportionally;
2. if that token already occurs at least `win_size * tau_r` times among the last `win_size` decoded
   tokens, set its score to -inf and draw again from the whole remaining distribution (no top-p/k).

Each draw is one `torch.multinomial(..., 1, replacement=True)` call on the request's own generator,
so a seeded request gives the same tokens whatever other requests do in between.

Before the minimum length, every id >= `speech_token_size` (EOS and the other stop ids) is masked.
The official HF decode loop masks only id `speech_token_size` (the CosyVoice2 EOS; in CosyVoice3
that id is sos, while EOS is `speech_token_size + 1`), which lets EOS end a sentence early; its vLLM
path masks all stop ids, which is what this module does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from cosyserve.model.config import SamplingConfig


def nucleus_sample(scores: Tensor, top_p: float, top_k: int, generator: torch.Generator) -> int:
    """Draw from the smallest high-probability set (top-p, at most top-k) of `scores` `(V,)`."""
    probs = scores.softmax(dim=0)
    sorted_probs, order = probs.sort(descending=True, stable=True)
    sorted_probs, order = sorted_probs[:top_k], order[:top_k]
    # Mass taken before each candidate; a candidate is taken while that mass is still below top_p,
    # so the token that crosses top_p is included.
    mass_before = torch.cat([sorted_probs.new_zeros(1), torch.cumsum(sorted_probs, dim=0)[:-1]])
    count = max(int((mass_before < top_p).sum().item()), 1)
    choice = torch.multinomial(sorted_probs[:count], 1, replacement=True, generator=generator)
    return int(order[choice].item())


def full_sample(scores: Tensor, generator: torch.Generator) -> int:
    """Draw from the whole softmax of `scores` `(V,)`."""
    return int(torch.multinomial(scores.softmax(dim=0), 1, replacement=True, generator=generator).item())


def repetition_aware_sample(
    scores: Tensor, history: Sequence[int], config: SamplingConfig, generator: torch.Generator
) -> int:
    """Nucleus draw, redrawn from the full distribution without that token if it repeats too often.

    `scores` `(V,)` are log-probabilities (or logits); a redraw modifies them in place.
    `win_size` <= 0 turns the rule off.
    """
    token = nucleus_sample(scores, config.top_p, config.top_k, generator)
    if config.win_size <= 0:  # no window: the repetition rule is off
        return token
    repeats = sum(1 for previous in history[-config.win_size :] if previous == token)
    if repeats >= config.win_size * config.tau_r:
        scores[token] = -float("inf")
        token = full_sample(scores, generator)
    return token


class SpeechTokenSampler:
    """Per-request sampling state: the generator, the decoded history and the length limits.

    `min_len` tokens are produced before a stop id may be drawn; the caller stops after `max_len`.
    """

    def __init__(
        self,
        config: SamplingConfig,
        speech_token_size: int,
        *,
        min_len: int = 0,
        generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> None:
        if generator is None:
            generator = torch.Generator()
            if seed is None:
                generator.seed()
            else:
                generator.manual_seed(seed)
        elif seed is not None:
            generator.manual_seed(seed)
        self.config = config
        self.speech_token_size = speech_token_size
        self.min_len = min_len
        self.generator = generator
        self.history: list[int] = []

    def is_stop(self, token: int) -> bool:
        """Whether `token` ends decoding (EOS or any other special id)."""
        return token >= self.speech_token_size

    def sample(self, logp: Tensor) -> int:
        """Draw the next token from `logp` `(V,)` (modified in place) and record it unless it is a stop id."""
        if logp.device != self.generator.device:
            logp = logp.to(self.generator.device)
        if len(self.history) < self.min_len:
            logp[self.speech_token_size :] = -float("inf")
        token = repetition_aware_sample(logp, self.history, self.config, self.generator)
        if not self.is_stop(token):
            self.history.append(token)
        return token
