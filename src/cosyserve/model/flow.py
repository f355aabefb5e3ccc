"""The flow-matching acoustic model: speech tokens -> 80-bin mel at 50 Hz.

Tokens (prompt ++ new) are embedded, mixed with a few tokens of look-ahead by two convolutions,
repeated `token_mel_ratio` times to the mel rate, and then a DiT velocity field is integrated from
fixed noise to a mel with a few Euler steps and classifier-free guidance (`flow_solver`). The prompt
mel conditions the first frames; only the frames after it are returned. Attribute names reproduce the
official `flow.pt` keys (`input_embedding`, `spk_embed_affine_layer`, `pre_lookahead_layer`,
`decoder.estimator`).

Streaming passes that continue earlier ones are math here (`solve_span`); what a stream keeps between
them, and within which budget, is the engine's (`cosyserve.engine.flow_stream`).

Shapes: T tokens, Tp prompt tokens, Tm prompt mel frames, N = total mel frames, C mel channels (80).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from cosyserve.errors import InputError
from cosyserve.model.config import FlowConfig
from cosyserve.model.dit import kv_dtype
from cosyserve.model.flow_solver import DEFAULT_N_TIMESTEPS, CausalCFM

__all__ = ["DEFAULT_N_TIMESTEPS", "MAX_MEL_FRAMES", "CausalFlow", "FlowInputs", "fixed_start_noise"]

MAX_MEL_FRAMES = 15000  # 300 s at 50 Hz: the length of the official fixed start noise
_NOISE_SEED = 0

_official_noise: dict[int, torch.Tensor] = {}
_noise_lock = threading.Lock()


def fixed_start_noise(channels: int = 80) -> torch.Tensor:
    """The official start noise (1, channels, MAX_MEL_FRAMES), CPU float32: a read-only constant made
    once per process, from which every flow's `start_noise` buffer is taken.

    Equal to `torch.manual_seed(0); torch.randn(1, 80, 15000)`, drawn from a private generator so the
    global RNG is untouched. Every request starts from its first N frames, which makes output
    deterministic and lets streaming chunks agree with one-shot synthesis.
    """
    with _noise_lock:
        noise = _official_noise.get(channels)
        if noise is None:
            generator = torch.Generator(device="cpu").manual_seed(_NOISE_SEED)
            noise = torch.randn(1, channels, MAX_MEL_FRAMES, generator=generator, device="cpu")
            _official_noise[channels] = noise
    return noise


@dataclass(frozen=True)
class FlowInputs:
    """A flow call's checked inputs on the parameters' device (`CausalFlow.prepare_inputs`)."""

    tokens: torch.Tensor  # (1, Tp + T) int64: prompt tokens, then the new ones
    noise: torch.Tensor  # (1, C, N) float32: the first N frames of the fixed start noise
    mu: torch.Tensor  # (1, C, N) token condition
    spks: torch.Tensor  # (1, C) projected speaker embedding
    cond: torch.Tensor  # (1, C, N) prompt mel on its frames, zeros after

    @property
    def frames(self) -> int:
        return int(self.noise.shape[2])


class PreLookaheadLayer(nn.Module):
    """Each token sees the `lookahead` tokens after it, then a causal conv; residual. (B, T, C) -> same."""

    def __init__(self, in_channels: int, channels: int, lookahead: int) -> None:
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(in_channels, channels, kernel_size=lookahead + 1)
        self.conv2 = nn.Conv1d(channels, in_channels, kernel_size=3)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, C); context: (B, lookahead, C) tokens after x that are seen but not output.

        Without context the sequence is final and the look-ahead is zero padding.
        """
        h = x.transpose(1, 2)
        if context is None:
            h = F.pad(h, (0, self.lookahead))
        else:
            h = torch.cat((h, context.transpose(1, 2)), dim=2)
        h = F.leaky_relu(self.conv1(h))
        h = self.conv2(F.pad(h, (self.conv2.kernel_size[0] - 1, 0)))
        return h.transpose(1, 2) + x


class CausalFlow(nn.Module):
    """Speech tokens + prompt (tokens, mel, speaker embedding) -> mel of the new tokens."""

    def __init__(self, config: FlowConfig) -> None:
        super().__init__()
        self.config = config
        self.token_mel_ratio = config.token_mel_ratio
        self.lookahead = config.pre_lookahead_len
        self.input_embedding = nn.Embedding(config.vocab_size, config.input_size)
        self.spk_embed_affine_layer = nn.Linear(config.spk_embed_dim, config.output_size)
        pre = config.pre_lookahead
        self.pre_lookahead_layer = PreLookaheadLayer(pre.in_channels, pre.channels, pre.pre_lookahead_len)
        self.decoder = CausalCFM(config.cfm, config.dit)
        # The start noise is this model's buffer: it follows the model to its device (once), and is
        # freed with it. Not in the checkpoint, and never cast with the weights (`start_noise` frames).
        self.register_buffer("start_noise", fixed_start_noise(config.output_size), persistent=False)

    @property
    def context_frames(self) -> int:
        """Earlier frames the DiT's position convolutions read (what a continued pass needs of them)."""
        return self.decoder.estimator.input_embed.conv_pos_embed.context_frames

    def speaker_condition(self, embedding: torch.Tensor) -> torch.Tensor:
        """Speaker embedding (1, spk_embed_dim) -> L2-normalised and projected (1, C)."""
        return self.spk_embed_affine_layer(F.normalize(embedding, dim=1))

    def token_condition(self, tokens: torch.Tensor, finalize: bool) -> torch.Tensor:
        """All tokens (1, Tp + T) -> per-frame condition mu (1, C, N).

        finalize=False: the last `lookahead` tokens are only look-ahead context for the tokens before
        them and produce no frames (they arrive again, with their own look-ahead, in the next chunk).
        Ids are clamped into the codebook: host ids were checked (`check_inputs`), and device ids are
        never read past the embedding table.
        """
        h = self.input_embedding(tokens.clamp(0, self.config.vocab_size - 1))
        if finalize:
            h = self.pre_lookahead_layer(h)
        else:
            h = self.pre_lookahead_layer(h[:, : -self.lookahead], context=h[:, -self.lookahead :])
        return h.repeat_interleave(self.token_mel_ratio, dim=1).transpose(1, 2)

    def mel_frames(self, n_tokens: int, finalize: bool) -> int:
        """Mel frames (prompt included) that `n_tokens` prompt + new tokens produce."""
        return (n_tokens - (0 if finalize else self.lookahead)) * self.token_mel_ratio

    def check_inputs(
        self,
        token: torch.Tensor,
        prompt_token: torch.Tensor,
        prompt_feat: torch.Tensor,
        embedding: torch.Tensor,
        finalize: bool,
    ) -> int:
        """Validate shapes, lengths and host-side ids; return the total number of mel frames N.

        Ids on an accelerator are not read (that would wait for the device): check them before moving
        them there (the engine keeps speech tokens on the host).
        """
        cfg = self.config
        if token.dim() != 2 or prompt_token.dim() != 2 or token.shape[0] != 1 or prompt_token.shape[0] != 1:
            raise InputError(
                f"flow expects token and prompt_token of shape (1, T), got {tuple(token.shape)} and "
                f"{tuple(prompt_token.shape)}; run one utterance per call"
            )
        if prompt_feat.dim() != 3 or prompt_feat.shape[0] != 1 or prompt_feat.shape[2] != cfg.output_size:
            raise InputError(
                f"prompt_feat must have shape (1, frames, {cfg.output_size}), got {tuple(prompt_feat.shape)}"
            )
        if embedding.shape != (1, cfg.spk_embed_dim):
            raise InputError(
                f"speaker embedding must have shape (1, {cfg.spk_embed_dim}), got {tuple(embedding.shape)}"
            )
        self.check_ids(token, "token")
        self.check_ids(prompt_token, "prompt_token")
        n_tokens = prompt_token.shape[1] + token.shape[1]
        if not finalize and n_tokens <= self.lookahead:
            raise InputError(
                f"a non-final flow call needs more than {self.lookahead} tokens (the last {self.lookahead} "
                f"are look-ahead only), got {n_tokens}"
            )
        n_frames = self.mel_frames(n_tokens, finalize)
        if n_frames > MAX_MEL_FRAMES:
            seconds = MAX_MEL_FRAMES / (cfg.input_frame_rate * self.token_mel_ratio)
            raise InputError(
                f"{n_frames} mel frames (prompt + new speech) exceed the limit of {MAX_MEL_FRAMES} "
                f"({seconds:.0f} s of audio); split the text into shorter sentences or use a shorter prompt"
            )
        if prompt_feat.shape[1] > n_frames:
            raise InputError(
                f"prompt_feat has {prompt_feat.shape[1]} frames but the tokens give only {n_frames}; "
                f"the prompt mel must be {cfg.token_mel_ratio} frames per prompt token at most"
            )
        return n_frames

    def check_ids(self, ids: torch.Tensor, name: str = "token") -> None:
        """InputError for a host tensor holding an id outside the codebook; device tensors pass unread."""
        if ids.device.type != "cpu" or not ids.numel():
            return
        top = int(ids.max())
        if top >= self.config.vocab_size:
            raise InputError(
                f"{name} holds id {top}, outside the {self.config.vocab_size} speech codes; "
                "drop special tokens (eos, sos, ...) before the flow"
            )

    @torch.inference_mode()
    def inference(
        self,
        token: torch.Tensor,
        prompt_token: torch.Tensor,
        prompt_feat: torch.Tensor,
        embedding: torch.Tensor,
        streaming: bool = False,
        finalize: bool = True,
        n_timesteps: int = DEFAULT_N_TIMESTEPS,
        guidance: bool = True,
    ) -> torch.Tensor:
        """Mel (1, C, N - Tm) float32 for the new tokens only.

        token: (1, T) and prompt_token: (1, Tp) integer ids; prompt_feat: (1, Tm, C) prompt mel;
        embedding: (1, spk_embed_dim) speaker embedding (normalised here). streaming: chunked attention,
        so a prefix's frames do not depend on later tokens. finalize: False while more tokens will follow
        (the last `pre_lookahead_len` tokens are then context only). Raises InputError for bad shapes,
        unknown ids or more than MAX_MEL_FRAMES frames. Computed on the parameters' device and dtype.
        n_timesteps (fewer than 10) and guidance=False are speed options that change the output.
        """
        inputs = self.prepare_inputs(token, prompt_token, prompt_feat, embedding, finalize)
        mel = self.decoder.solve(
            inputs.noise, inputs.mu, None, inputs.spks, inputs.cond, streaming, n_timesteps, guidance
        )
        return mel[:, :, prompt_feat.shape[1] :].float()

    def keepable_frames(self, n_tokens: int, stop: int) -> int:
        """Frames from the first prompt frame whose streaming keys and values no later token changes,
        for a pass over `n_tokens` tokens up to frame `stop`: whole chunks whose token conditions have
        their real look-ahead (a finalized pass pads it)."""
        stable = min(stop, (n_tokens - self.lookahead) * self.token_mel_ratio)
        chunk = self.config.dit.static_chunk_size
        return stable // chunk * chunk

    def tokens_determining(self, frames: int) -> int:
        """How many tokens (prompt first) the conditions of frames 0 .. frames - 1 read."""
        return (frames - 1) // self.token_mel_ratio + self.lookahead + 1

    @torch.inference_mode()
    def solve_span(
        self,
        inputs: FlowInputs,
        start: int,
        stop: int,
        past_kv: Sequence[torch.Tensor] = (),
        embed_context: torch.Tensor | None = None,
        *,
        keep: int = 0,
        n_timesteps: int = DEFAULT_N_TIMESTEPS,
        guidance: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The streaming (chunked attention) mel of frames start .. stop - 1 of `inputs`, counted from
        the first prompt frame, the frames before `start` (whole chunks) given by their keys and values
        and projected inputs (`CausalCFM.solve_continued`). Returns (mel (1, C, stop - start) float32,
        the kept keys and values of the first `keep` frames, their last projected inputs): the values of
        `inference(..., streaming=True)` on those frames, up to rounding."""
        span = slice(start, stop)
        mel, kv, context = self.decoder.solve_continued(
            inputs.noise[:, :, span], inputs.mu[:, :, span], inputs.spks, inputs.cond[:, :, span], start,
            past_kv, embed_context, n_timesteps, guidance, keep=keep, context_frames=self.context_frames,
        )  # fmt: skip
        return mel.float(), kv, context

    def prefix_nbytes(
        self, frames: int, n_timesteps: int = DEFAULT_N_TIMESTEPS, guidance: bool = True
    ) -> int:
        """Memory that keeping `frames` frames of a streaming pass costs: keys and values of every layer
        at every solver step (2 x S x L x R x H x Dh a frame: 3.6 MB full-size in float32), in the
        attention's dtype (`DiT.kv_dtype`: bfloat16 in the fast preset's bfloat16 DiT), and the projected
        inputs of the last `context_frames` of them (S x R x D a frame), in the dtype the pass computes
        in (autocast's, when on)."""
        dit = self.config.dit
        kv_item = torch.empty((), dtype=self.decoder.estimator.kv_dtype()).element_size()
        item = torch.empty((), dtype=kv_dtype(self.spk_embed_affine_layer.weight)).element_size()
        rows = 2 if guidance else 1
        per_frame = 2 * n_timesteps * dit.depth * rows * dit.heads * dit.dim_head * kv_item
        context = n_timesteps * rows * min(frames, self.context_frames) * dit.dim * item
        return frames * per_frame + context

    def prepare_inputs(
        self,
        token: torch.Tensor,
        prompt_token: torch.Tensor,
        prompt_feat: torch.Tensor,
        embedding: torch.Tensor,
        finalize: bool,
    ) -> FlowInputs:
        """Checked inputs on the parameters' device and dtype (`FlowInputs`); the noise float32."""
        n_frames = self.check_inputs(token, prompt_token, prompt_feat, embedding, finalize)
        param = self.spk_embed_affine_layer.weight
        device, dtype = param.device, param.dtype
        ids = [t.to(device=device, dtype=torch.long, non_blocking=True) for t in (prompt_token, token)]
        tokens = torch.cat(ids, dim=1)
        spks = self.speaker_condition(embedding.to(device=device, dtype=dtype))
        mu = self.token_condition(tokens, finalize)
        cond = torch.zeros_like(mu)
        cond[:, :, : prompt_feat.shape[1]] = prompt_feat.to(device=device, dtype=dtype).transpose(1, 2)
        noise = self.start_noise[:, :, :n_frames].to(device=device, dtype=dtype)
        return FlowInputs(tokens, noise, mu, spks, cond)
