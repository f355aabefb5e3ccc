"""Speech-token generation: one prefill over the prefix, then one-token decode steps through a KV cache.

Each request owns its cache and its random generator; the model is shared and never mutated, so
requests may run concurrently (or interleave in one thread) and a seeded request is reproducible.
Tokens are yielded as soon as they are drawn, for streaming.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from cosyserve.engine.device import to_device
from cosyserve.engine.kv_cache import KVCache
from cosyserve.engine.sampling import SpeechTokenSampler
from cosyserve.errors import InputError
from cosyserve.model.config import SamplingConfig
from cosyserve.model.speech_lm import SpeechLM

if TYPE_CHECKING:
    from cosyserve.engine.cuda_graph import StaticDecodePool, StaticDecodeStep
    from cosyserve.engine.decode_batching import BatchMember, DecodeBatcher

# `<|endofprompt|>` in the CosyVoice3 tokenizer. The model was trained with it in every prompt; the
# official code refuses input without it, and so do we (it points at a front-end bug).
ENDOFPROMPT_ID = 151646

TokenIds = Sequence[int] | Tensor
CancelCheck = Callable[[], bool] | threading.Event


@dataclass(frozen=True)
class PromptPrefix:
    """A voice's `[sos, prompt_text]` already run through the LM (`SpeechLMRunner.prepare_prefix`)."""

    prompt_text_ids: Tensor  # (Tp,) int64, on CPU
    cache: KVCache  # exactly 1 + Tp positions; cloned, never written, by requests that use it


def length_limits(text_len: int, min_ratio: float, max_ratio: float) -> tuple[int, int]:
    """(min_len, max_len) speech tokens for `text_len` text tokens (prompt text not counted)."""
    return int(text_len * min_ratio), int(text_len * max_ratio)


def prefill(model: SpeechLM, embeds: Tensor, cache: KVCache) -> Tensor:
    """Append `embeds` `(B, T, hidden)` to `cache`; return log-probs `(B, V)` at the last position."""
    start = cache.reserve(embeds.shape[1])
    return model(embeds, cache.buffer, start)


def decode_one(model: SpeechLM, token: Tensor, cache: KVCache) -> Tensor:
    """Feed one speech token per batch row, `token` `(B,)`; return log-probs `(B, V)` for the next one.

    Kept minimal (embedding lookup + one model call, no mask) so a fixed-shape variant can be
    captured in a CUDA graph.
    """
    start = cache.reserve(1)
    return model(model.embed_speech(token[:, None]), cache.buffer, start)


class SpeechLMRunner:
    """Generates speech tokens for one sentence at a time with a shared `SpeechLM`.

    Opt-in GPU paths (the default decodes each request alone, eagerly):
    `batch_decode`: a `DecodeBatcher` through which concurrent requests decode in one batched forward
    (a request that finds no free slot decodes alone). `use_cuda_graph`: on CUDA, decode steps replay a
    CUDA graph over static buffers (`cuda_graph.StaticDecodePool`, every bucket captured here, when the
    runner is built at engine start; ignored on the CPU, and not used for requests in a batch).
    `static_pool` may also be set directly, e.g. an eager pool (`capture=False`) to run the
    static-buffer step on the CPU.
    """

    def __init__(
        self,
        model: SpeechLM,
        *,
        sampling: SamplingConfig | None = None,
        min_token_text_ratio: float = 2.0,
        max_token_text_ratio: float = 20.0,
        endofprompt_id: int | None = ENDOFPROMPT_ID,
        batch_decode: DecodeBatcher | None = None,
        use_cuda_graph: bool = False,
    ) -> None:
        self.model = model
        self.config = model.config
        self.sampling = sampling or model.config.sampling
        self.min_ratio, self.max_ratio = min_token_text_ratio, max_token_text_ratio
        self.endofprompt_id = endofprompt_id
        if batch_decode is not None and batch_decode.model is not model:
            raise ValueError("the DecodeBatcher was built for another model")
        self.batcher = batch_decode
        self.static_pool: StaticDecodePool | None = None
        if use_cuda_graph and self._device.type == "cuda":
            from cosyserve.engine.cuda_graph import capture_at_start

            self.static_pool = capture_at_start(model)  # now, at engine start; None if out of memory

    @property
    def _device(self) -> torch.device:
        return self.model.speech_embedding.weight.device

    @property
    def _dtype(self) -> torch.dtype:
        return self.model.speech_embedding.weight.dtype

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache.allocate(self.config.qwen2, capacity, device=self._device, dtype=self._dtype)

    @torch.inference_mode()
    def prepare_prefix(self, prompt_text_ids: TokenIds) -> PromptPrefix:
        """Run a voice's `[sos, prompt_text]` once; pass the result as `prefix=` to later requests."""
        prompt_text = self._text_tensor(prompt_text_ids, "prompt text")
        embeds = self.model.embed_voice_prefix(prompt_text)
        cache = self.new_cache(embeds.shape[1])
        prefill(self.model, embeds, cache)
        return PromptPrefix(prompt_text, cache)

    def generate(
        self,
        text_ids: TokenIds,
        prompt_text_ids: TokenIds = (),
        prompt_speech_ids: TokenIds = (),
        *,
        prefix: PromptPrefix | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        cancel: CancelCheck | None = None,
    ) -> Iterator[int]:
        """Yield speech tokens (ids < speech_token_size) until a stop id, `max_len`, or `cancel`.

        Inputs are checked here, before anything runs (InputError); the returned iterator does the work.
        `prefix` replaces `prompt_text_ids` with a prepared voice prefix. `seed` or `generator` make
        the draw reproducible; `cancel` (a callable or a threading.Event) is checked before every step.
        """
        if prefix is not None:
            if len(prompt_text_ids) != 0:
                raise InputError("pass either prompt_text_ids or a prepared prefix, not both")
            prompt_text = prefix.prompt_text_ids
        else:
            prompt_text = self._text_tensor(prompt_text_ids, "prompt text")
        text = self._text_tensor(text_ids, "text")
        speech = self._speech_tensor(prompt_speech_ids)
        min_len, max_len = self._check_lengths(prompt_text, text, speech)
        sampler = SpeechTokenSampler(
            self.sampling, self.config.speech_token_size, min_len=min_len, generator=generator, seed=seed
        )
        return self._decode(prompt_text, text, speech, prefix, sampler, max_len, _cancel_check(cancel))

    def session(self, capacity: int, prefix: PromptPrefix | None = None) -> DecodeSession:
        """A request's decoding with `capacity` positions: the path this runner's options choose (a
        static CUDA-graph step, a decode batch after prefill, or a plain cache). Use as a context
        manager: leaving it frees the batch slot or static step (also on errors and cancellation)."""
        return DecodeSession(self, capacity, prefix)

    @torch.inference_mode()
    def _decode(
        self,
        prompt_text: Tensor,
        text: Tensor,
        speech: Tensor,
        prefix: PromptPrefix | None,
        sampler: SpeechTokenSampler,
        max_len: int,
        is_cancelled: Callable[[], bool],
    ) -> Iterator[int]:
        if is_cancelled():
            return
        suffix = self.model.embed_request_suffix(
            to_device(text, self._device), to_device(speech, self._device)
        )
        capacity = 1 + len(prompt_text) + suffix.shape[1] + max_len
        with self.session(capacity, prefix) as session:
            if prefix is None:
                voice = self.model.embed_voice_prefix(to_device(prompt_text, self._device))
                suffix = torch.cat([voice, suffix], dim=1)
            logp = session.prefill(suffix)
            for step in range(max_len):
                token = sampler.sample(logp[0])
                if sampler.is_stop(token):
                    return
                yield token
                # The last allowed token is never fed back: nothing would read its output.
                if step + 1 == max_len or is_cancelled():
                    return
                logp = session.step(token)

    def _decode_step(
        self, cache: KVCache, static: StaticDecodeStep | None, member: BatchMember | None
    ) -> Callable[[int], Tensor]:
        """The function that feeds one token and returns log-probs `(1, V)`."""
        if member is not None:
            batcher = self.batcher
            return lambda token: batcher.step(member, token)[None]  # type: ignore[union-attr]
        if static is not None:
            return static
        device = self._device
        return lambda token: decode_one(self.model, to_device(torch.tensor([token]), device), cache)

    def _text_tensor(self, ids: TokenIds, what: str) -> Tensor:
        tensor = torch.as_tensor(ids, dtype=torch.long).reshape(-1).cpu()
        vocab = self.config.qwen2.vocab_size
        if tensor.numel() and (int(tensor.min()) < 0 or int(tensor.max()) >= vocab):
            raise InputError(
                f"{what} token ids must lie in [0, {vocab}); check the tokenizer matches the model"
            )
        return tensor

    def _speech_tensor(self, ids: TokenIds) -> Tensor:
        tensor = torch.as_tensor(ids, dtype=torch.long).reshape(-1).cpu()
        codes = self.config.speech_token_size
        if tensor.numel() and (int(tensor.min()) < 0 or int(tensor.max()) >= codes):
            raise InputError(
                f"prompt speech tokens must lie in [0, {codes}); they come from speech_tokenizer_v3.onnx "
                "of the same model download"
            )
        return tensor

    def _check_lengths(self, prompt_text: Tensor, text: Tensor, speech: Tensor) -> tuple[int, int]:
        if text.numel() == 0:
            raise InputError("the text to speak is empty after tokenization; give at least one word")
        if self.endofprompt_id is not None and not (
            bool((prompt_text == self.endofprompt_id).any()) or bool((text == self.endofprompt_id).any())
        ):
            raise InputError(
                f"<|endofprompt|> (id {self.endofprompt_id}) is in neither the prompt text nor the text; "
                "CosyVoice3 needs it: build the prompt with the front end's prompt builder"
            )
        min_len, max_len = length_limits(len(text), self.min_ratio, self.max_ratio)
        total = 1 + len(prompt_text) + len(text) + 1 + len(speech) + max_len
        limit = self.model.qwen2.rotary.max_positions
        if total > limit:
            raise InputError(
                f"this sentence needs up to {total} LM positions but the model has {limit}; "
                "split the text into shorter sentences or use a shorter prompt"
            )
        return min_len, max_len


class DecodeSession:
    """One request's KV cache and decode step on the path its runner's options choose.

    `prefill(embeds)` appends the prefix (after a voice's cached `[sos, prompt_text]` when given) and
    returns the log-probs `(1, V)` of the first token; `step(token)` feeds one token and returns the
    next log-probs. On the batching path the request joins the decode batch after its prefill; on the
    graph path it decodes through a static step (`cuda_graph`). `close()` (or leaving the `with`
    block) gives the slot or step back.
    """

    def __init__(self, runner: SpeechLMRunner, capacity: int, prefix: PromptPrefix | None = None) -> None:
        self.runner = runner
        self.static: StaticDecodeStep | None = None
        if runner.static_pool is not None and runner.batcher is None:
            self.static = runner.static_pool.acquire(capacity)
        if prefix is not None:
            if self.static is not None:
                self.cache = self.static.reset(prefix.cache)
            else:
                self.cache = prefix.cache.to(runner.model.speech_embedding.weight.device).clone(capacity)
        else:
            self.cache = self.static.reset() if self.static is not None else runner.new_cache(capacity)
        self.member: BatchMember | None = None
        self._step: Callable[[int], Tensor] | None = None

    def prefill(self, embeds: Tensor) -> Tensor:
        logp = prefill(self.runner.model, embeds, self.cache)
        if self.runner.batcher is not None:
            self.member = self.runner.batcher.join(self.cache)
        self._step = self.runner._decode_step(self.cache, self.static, self.member)
        return logp

    def step(self, token: int) -> Tensor:
        if self._step is None:
            raise RuntimeError("prefill before the first decode step")
        return self._step(token)

    def close(self) -> None:
        if self.member is not None:
            self.runner.batcher.leave(self.member)  # type: ignore[union-attr]
            self.member = None
        if self.static is not None:
            self.runner.static_pool.release(self.static)  # type: ignore[union-attr]
            self.static = None

    def __enter__(self) -> DecodeSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _cancel_check(cancel: CancelCheck | None) -> Callable[[], bool]:
    if cancel is None:
        return lambda: False
    if isinstance(cancel, threading.Event):
        return cancel.is_set
    return cancel
