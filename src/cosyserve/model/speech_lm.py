"""The CosyVoice3 speech language model: Qwen2 plus a speech-token embedding and decoder.

The LM reads one prefix and then speech tokens one at a time:

    [speech_embedding[sos], embed_tokens(prompt_text ++ text), speech_embedding[task_id],
     speech_embedding(prompt_speech_tokens)]  →  speech tokens

Text ids go through Qwen2's own `embed_tokens`; every speech id, sos and task_id included, goes
through `speech_embedding` (6561 codes + 200 special rows). `llm_decoder` maps the last hidden state
to log-probabilities over the same 6761 ids; any id >= `speech_token_size` ends decoding.

`llm.pt` names the Qwen2 weights `llm.model.model.*` and also carries `llm.model.lm_head.weight`
(vocab x hidden), which speech decoding never uses: it is dropped before loading, never held.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from cosyserve.model.checkpoint import load_into, read_state_dict
from cosyserve.model.config import LLMConfig
from cosyserve.model.no_init import NoRandomInit
from cosyserve.model.qwen2 import Qwen2Model

CHECKPOINT_QWEN2_PREFIX = "llm.model.model."
UNUSED_CHECKPOINT_KEYS = ("llm.model.lm_head.weight",)  # text LM head: speech decoding never reads it


class SpeechLM(nn.Module):
    """Inference-only `CosyVoice3LM`. Build with `SpeechLM.from_checkpoint` or on the meta device."""

    def __init__(self, config: LLMConfig) -> None:
        super().__init__()
        self.config = config
        self.qwen2 = Qwen2Model(config.qwen2)
        self.speech_embedding = nn.Embedding(config.decoder_size, config.llm_input_size)
        self.llm_decoder = nn.Linear(config.llm_output_size, config.decoder_size, bias=False)

    @property
    def hidden_size(self) -> int:
        return self.config.llm_input_size

    def embed_text(self, text_ids: Tensor) -> Tensor:
        """Text token ids `(B, T)` → `(B, T, hidden)` via Qwen2's `embed_tokens`."""
        return self.qwen2.embed_tokens(text_ids)

    def embed_speech(self, speech_ids: Tensor) -> Tensor:
        """Speech token ids (codes or specials) `(B, T)` → `(B, T, hidden)`."""
        return self.speech_embedding(speech_ids)

    def embed_voice_prefix(self, prompt_text_ids: Tensor) -> Tensor:
        """`[sos, prompt_text]` → `(1, 1 + Tp, hidden)`: the part of the prefix set by the voice alone.

        A saved voice's KV cache for this part can be computed once and reused.
        """
        device = self.speech_embedding.weight.device
        sos = self.embed_speech(torch.tensor([[self.config.sos]], device=device))
        return torch.cat([sos, self.embed_text(prompt_text_ids.to(device).long()[None])], dim=1)

    def embed_request_suffix(self, text_ids: Tensor, prompt_speech_ids: Tensor) -> Tensor:
        """`[text, task_id, prompt_speech]` → `(1, Tt + 1 + Ts, hidden)`: the rest of the prefix."""
        device = self.speech_embedding.weight.device
        text = self.embed_text(text_ids.to(device).long()[None])
        task = self.embed_speech(torch.tensor([[self.config.task_id]], device=device))
        speech = self.embed_speech(prompt_speech_ids.to(device).long()[None])
        return torch.cat([text, task, speech], dim=1)

    def embed_prefix(self, prompt_text_ids: Tensor, text_ids: Tensor, prompt_speech_ids: Tensor) -> Tensor:
        """The LM input before the first generated token, `(1, L, hidden)`.

        `prompt_text_ids` `(Tp,)`, `text_ids` `(Tt,)`, `prompt_speech_ids` `(Ts,)`; any may be empty.
        L = 1 + Tp + Tt + 1 + Ts. Note the text to speak sits between the prompt text and the prompt
        speech tokens, so only `[sos, prompt_text]` is shared between requests for one voice.
        """
        return torch.cat(
            [
                self.embed_voice_prefix(prompt_text_ids),
                self.embed_request_suffix(text_ids, prompt_speech_ids),
            ],
            dim=1,
        )

    def forward(
        self, embeds: Tensor, kv: Tensor, start: int, *, hidden_states: list[Tensor] | None = None
    ) -> Tensor:
        """Log-probabilities `(B, decoder_size)` (float32) at the last of the `T` new positions.

        `embeds` `(B, T, hidden)` are placed at positions `[start, start + T)` of the cache `kv`
        `(layers, 2, B, kv_heads, capacity, head_dim)`, which this call extends.
        """
        hidden = self.qwen2(embeds, kv, start, hidden_states=hidden_states)
        return self.llm_decoder(hidden[:, -1]).float().log_softmax(dim=-1)

    def decode_rows(self, tokens: Tensor, kv: Tensor, positions: Tensor, keys: int) -> Tensor:
        """Feed one speech token per row, each row at its own position; log-probs `(B, decoder_size)`.

        `tokens`, `positions` `(B,)` int64; `kv` `(layers, 2, B, kv_heads, capacity, head_dim)`; row b
        is written at `positions[b]` and sees its keys up to there, inside the first `keys` positions.
        Rows never mix, so each row equals a one-row `forward` at its position (to float rounding).
        """
        hidden = self.qwen2.forward_rows(self.embed_speech(tokens[:, None]), kv, positions, keys)
        return self.llm_decoder(hidden[:, -1]).float().log_softmax(dim=-1)

    @classmethod
    def from_checkpoint(
        cls,
        path: Path,
        config: LLMConfig,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> SpeechLM:
        """Load `llm.pt` strictly (missing, unexpected or misshaped keys raise CheckpointError).

        The module is built on the meta device and takes the memory-mapped tensors themselves, so no
        random initialisation runs and the unused text LM head is never read from disk.
        """
        state = checkpoint_to_module_names(read_state_dict(path))
        with torch.device("meta"), NoRandomInit():  # a meta tensor's init would import torch._dynamo (1.3 s)
            model = cls(config)
        load_into(model, state, path.name)
        model.qwen2.rotary.rebuild(model.speech_embedding.weight.device)
        model = model.to(device=device, dtype=dtype)
        model.requires_grad_(False)
        return model.eval()


def checkpoint_to_module_names(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename `llm.pt` keys to `SpeechLM` names and drop the unused text LM head.

    Keys outside the known layout pass through unchanged, so the strict load reports them.
    """
    renamed: dict[str, Tensor] = {}
    for key, tensor in state.items():
        if key in UNUSED_CHECKPOINT_KEYS:
            continue
        if key.startswith(CHECKPOINT_QWEN2_PREFIX):
            key = "qwen2." + key[len(CHECKPOINT_QWEN2_PREFIX) :]
        renamed[key] = tensor
    return renamed
