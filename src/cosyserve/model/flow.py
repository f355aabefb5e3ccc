"""The flow-matching acoustic model: speech tokens -> 80-bin mel at 50 Hz.

Tokens (prompt ++ new) are embedded, mixed with a few tokens of look-ahead by two convolutions,
repeated `token_mel_ratio` times to the mel rate, and then a DiT velocity field is integrated from
fixed noise to a mel with a few Euler steps and classifier-free guidance. The prompt mel conditions
the first frames; only the frames after it are returned. Attribute names reproduce the official
`flow.pt` keys (`input_embedding`, `spk_embed_affine_layer`, `pre_lookahead_layer`, `decoder.estimator`).

Shapes: T tokens, Tp prompt tokens, Tm prompt mel frames, N = total mel frames, C mel channels (80).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from cosyserve.errors import ConfigError, InputError
from cosyserve.model.config import CFMConfig, DiTConfig, FlowConfig
from cosyserve.model.dit import DiT
from cosyserve.model.flow_prefix import FlowPrefix, kv_dtype, prefix_nbytes

MAX_MEL_FRAMES = 15000  # 300 s at 50 Hz: the length of the official fixed start noise
DEFAULT_N_TIMESTEPS = 10  # Euler steps the official inference uses
_NOISE_SEED = 0

_noise_cache: dict[int, torch.Tensor] = {}
_device_noise: dict[tuple[int, str, torch.dtype], torch.Tensor] = {}
_noise_lock = threading.Lock()


def fixed_start_noise(channels: int = 80) -> torch.Tensor:
    """The official start noise (1, channels, MAX_MEL_FRAMES), CPU float32, created once per process.

    Equal to `torch.manual_seed(0); torch.randn(1, 80, 15000)`, drawn from a private generator so the
    global RNG is untouched. Every request starts from its first N frames, which makes output
    deterministic and lets streaming chunks agree with one-shot synthesis.
    """
    with _noise_lock:
        noise = _noise_cache.get(channels)
        if noise is None:
            generator = torch.Generator(device="cpu").manual_seed(_NOISE_SEED)
            noise = torch.randn(1, channels, MAX_MEL_FRAMES, generator=generator)
            _noise_cache[channels] = noise
    return noise


def start_noise(channels: int, frames: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The first `frames` frames of the fixed start noise (1, channels, frames) on `device` in `dtype`.

    On an accelerator the whole noise is kept there (once per device and dtype), so requests do not
    copy it from the host every time.
    """
    if device.type == "cpu":
        return fixed_start_noise(channels)[:, :, :frames].to(device=device, dtype=dtype)
    key = (channels, str(device), dtype)
    with _noise_lock:
        noise = _device_noise.get(key)
    if noise is None:
        noise = fixed_start_noise(channels).to(device=device, dtype=dtype)
        with _noise_lock:
            noise = _device_noise.setdefault(key, noise)
    return noise[:, :, :frames]


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


class CausalCFM(nn.Module):
    """Conditional flow matching sampler around the DiT estimator (Euler, cosine time schedule, CFG)."""

    def __init__(self, cfm: CFMConfig, dit: DiTConfig) -> None:
        super().__init__()
        if cfm.solver != "euler":
            raise ConfigError(f"flow solver {cfm.solver!r} in the YAML is not supported; use 'euler'")
        self.cfg_rate = cfm.inference_cfg_rate
        self.t_scheduler = cfm.t_scheduler
        self.estimator = DiT(dit)

    def estimate(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        streaming: bool,
        time: Sequence[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """One estimator call, velocity (B, C, N); arguments as `DiT.forward`. Kept apart to be swappable
        (compiled graphs, TensorRT) without touching the solver."""
        return self.estimator(x, mask, mu, t, spks, cond, streaming, time)

    def time_span(self, n_timesteps: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """(n_timesteps + 1,) times from 0 to 1; the cosine schedule takes smaller steps near t = 0."""
        t_span = torch.linspace(0, 1, n_timesteps + 1, device=device, dtype=dtype)
        if self.t_scheduler == "cosine":
            t_span = 1 - torch.cos(t_span * 0.5 * math.pi)
        return t_span

    def solve(
        self,
        noise: torch.Tensor,
        mu: torch.Tensor,
        mask: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        streaming: bool,
        n_timesteps: int = DEFAULT_N_TIMESTEPS,
        guidance: bool = True,
    ) -> torch.Tensor:
        """Integrate from `noise` (B, C, N) to a mel (B, C, N); B = 1 except for batched requests.

        mu, cond: (B, *, N); mask: (B, 1, N), zero on padding frames; spks: (B, spk_dim). Each step
        runs the estimator on the conditioned rows and the unconditioned ones (mu, spks, cond zeroed);
        the guided velocity is (1 + r) * v_cond - r * v_uncond. guidance=False (a speed option, not the
        official output) runs the conditioned rows alone and steps with v_cond.
        """
        mask_in = torch.cat((mask, mask)) if guidance else mask
        mu_in, spks_in, cond_in = _with_unconditioned(mu, spks, cond) if guidance else (mu, spks, cond)
        steps = list(self.euler_times(n_timesteps, mu.device, mu.dtype))
        times = self._step_times(steps, mu_in.shape[0])
        x = noise
        for step, (t, dt) in enumerate(steps):
            x_in = torch.cat((x, x)) if guidance else x
            velocity = self.estimate(
                x_in, mask_in, mu_in, t.expand(x_in.shape[0]), spks_in, cond_in, streaming, times[step]
            )
            x = self._step(x, dt, velocity, guidance)
        return x

    def _step_times(
        self, steps: list[tuple[torch.Tensor, torch.Tensor]], rows: int
    ) -> list[list[torch.Tensor]]:
        """Per solver step, `DiT.time_conditioning` of its time for `rows` rows, computed for all steps
        at once: each layer's modulation weights are read once per pass, not once per step."""
        per_layer = self.estimator.time_conditioning(
            torch.stack([t for t, _ in steps])[:, None].expand(-1, rows)
        )
        return [[layer[step] for layer in per_layer] for step in range(len(steps))]

    def solve_continued(
        self,
        noise: torch.Tensor,
        mu: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        start: int,
        prefix: FlowPrefix | None,
        n_timesteps: int = DEFAULT_N_TIMESTEPS,
        guidance: bool = True,
        keep: int = 0,
        context_frames: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """`solve` with chunked attention for frames start .. start + T - 1, the frames before them
        taken from `prefix` (None: start is 0).

        noise, mu, cond: (1, *, T) of those frames; spks: (1, spk_dim). Returns the mel (1, C, T) and,
        for the first `keep` of these frames only, what `FlowPrefix.extended` keeps: their keys and
        values at every solver step and layer in one block (S, L, 2, R, H, keep, Dh), written as the
        pass goes, and the projected inputs of the last `context_frames` of them (S, R, Tc, D); both
        None when keep is 0. R is 2 with guidance (conditioned, unconditioned), else 1.
        """
        mu_in, spks_in, cond_in = _with_unconditioned(mu, spks, cond) if guidance else (mu, spks, cond)
        estimator = self.estimator
        depth = len(estimator.transformer_blocks)
        kv = None
        if keep:
            dit = estimator.config
            shape = (n_timesteps, depth, 2, mu_in.shape[0], dit.heads, keep, dit.dim_head)
            kv = torch.empty(shape, device=mu.device, dtype=kv_dtype(estimator.proj_out.weight))
        contexts = []
        steps = list(self.euler_times(n_timesteps, mu.device, mu.dtype))
        times = self._step_times(steps, mu_in.shape[0])
        x = noise
        for step, (t, dt) in enumerate(steps):
            past = prefix.past(step, depth) if prefix is not None else [([], [])] * depth
            context = prefix.context(step) if prefix is not None else None
            x_in = torch.cat((x, x)) if guidance else x
            velocity, projected = estimator.forward_continued(
                x_in, mu_in, t.expand(x_in.shape[0]), spks_in, cond_in, start, past, context,
                None if kv is None else kv[step], times[step],
            )  # fmt: skip
            if keep:
                contexts.append(projected[:, max(0, keep - context_frames) : keep])
            x = self._step(x, dt, velocity, guidance)
        return x, kv, (torch.stack(contexts) if keep else None)

    def euler_times(
        self, n_timesteps: int, device: torch.device, dtype: torch.dtype
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(t, dt) of each Euler step. The time advances by accumulating dt (not by indexing the
        schedule) to match the official rounding."""
        t_span = self.time_span(n_timesteps, device, dtype)
        t, dt = t_span[0], t_span[1] - t_span[0]
        for step in range(1, n_timesteps + 1):
            yield t, dt
            t = t + dt
            if step < n_timesteps:
                dt = t_span[step + 1] - t

    def _step(
        self, x: torch.Tensor, dt: torch.Tensor, velocity: torch.Tensor, guidance: bool = True
    ) -> torch.Tensor:
        """One Euler step; guided from the conditioned and unconditioned halves of `velocity`."""
        if not guidance:
            return x + dt * velocity
        v_cond, v_uncond = velocity.chunk(2, dim=0)
        return x + dt * ((1.0 + self.cfg_rate) * v_cond - self.cfg_rate * v_uncond)


def _with_unconditioned(
    mu: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batch of two for classifier-free guidance: the conditions, then zeros."""
    return tuple(torch.cat((c, torch.zeros_like(c))) for c in (mu, spks, cond))


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

    def speaker_condition(self, embedding: torch.Tensor) -> torch.Tensor:
        """Speaker embedding (1, spk_embed_dim) -> L2-normalised and projected (1, C)."""
        return self.spk_embed_affine_layer(F.normalize(embedding, dim=1))

    def token_condition(self, tokens: torch.Tensor, finalize: bool) -> torch.Tensor:
        """All tokens (1, Tp + T) -> per-frame condition mu (1, C, N).

        finalize=False: the last `lookahead` tokens are only look-ahead context for the tokens before
        them and produce no frames (they arrive again, with their own look-ahead, in the next chunk).
        """
        h = self.input_embedding(tokens.clamp(min=0))
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
        """Validate shapes and lengths; return the total number of mel frames N."""
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
        n_tokens = prompt_token.shape[1] + token.shape[1]
        for name, ids in (("token", token), ("prompt_token", prompt_token)):
            if ids.numel() and int(ids.max()) >= cfg.vocab_size:
                raise InputError(
                    f"{name} holds id {int(ids.max())}, outside the {cfg.vocab_size} speech codes; "
                    "drop special tokens (eos, sos, ...) before the flow"
                )
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
        _, noise, mu, spks, cond = self.prepare_inputs(token, prompt_token, prompt_feat, embedding, finalize)
        mask = torch.ones_like(noise[:, :1])
        mel = self.decoder.solve(noise, mu, mask, spks, cond, streaming, n_timesteps, guidance)
        return mel[:, :, prompt_feat.shape[1] :].float()

    @torch.inference_mode()
    def inference_continued(
        self,
        token: torch.Tensor,
        prompt_token: torch.Tensor,
        prompt_feat: torch.Tensor,
        embedding: torch.Tensor,
        prefix: FlowPrefix | None = None,
        *,
        finalize: bool = False,
        n_timesteps: int = DEFAULT_N_TIMESTEPS,
        stop_frame: int | None = None,
        max_prefix_bytes: int | None = None,
        guidance: bool = True,
    ) -> tuple[torch.Tensor, FlowPrefix]:
        """The streaming (chunked attention) mel, computing only the frames after `prefix`.

        Arguments as `inference`; prefix: what an earlier call on the same prompt and a prefix of these
        tokens returned (None: nothing yet). Returns (mel, new prefix): mel (1, C, stop - prefix.frames)
        float32 of frames prefix.frames .. stop - 1 counted from the first PROMPT frame (unlike
        `inference`), stop = stop_frame or all N frames; these values are those of
        `inference(..., streaming=True, finalize=finalize)` up to rounding. The new prefix adds every
        whole chunk whose inputs no later token can change, as far as it then holds at most
        `max_prefix_bytes` (`prefix_nbytes`). Raises InputError as `inference` does, or when the tokens
        do not continue those of the prefix.
        """
        tokens, noise, mu, spks, cond = self.prepare_inputs(
            token, prompt_token, prompt_feat, embedding, finalize
        )
        n_tokens, n_frames = tokens.shape[1], noise.shape[2]
        if prefix is None:
            prefix = FlowPrefix(tokens[:, :0].cpu(), n_timesteps, guidance=guidance)
        prefix.check_continues(tokens, n_timesteps, guidance)
        start = prefix.frames
        stop = n_frames if stop_frame is None else min(stop_frame, n_frames)
        if stop <= start:
            if stop < start:
                raise InputError(f"stop_frame {stop} is before the {start} frames the prefix already holds")
            return noise[:, :, :0].float(), prefix
        # Decided before the pass, so that frames which will not be kept are never accumulated: whole
        # chunks whose token conditions have their real look-ahead (finalize pads it), within budget.
        stable = min(stop, (n_tokens - self.lookahead) * self.token_mel_ratio)
        chunk = self.config.dit.static_chunk_size
        keep_end = max(start, stable // chunk * chunk)
        while (
            keep_end > start
            and max_prefix_bytes is not None
            and self.prefix_nbytes(keep_end, n_timesteps, guidance) > max_prefix_bytes
        ):
            keep_end -= chunk  # as many whole chunks as the budget holds
        span = slice(start, stop)
        context_frames = self.decoder.estimator.input_embed.conv_pos_embed.context_frames
        mel, kv, context = self.decoder.solve_continued(
            noise[:, :, span], mu[:, :, span], spks, cond[:, :, span], start, prefix, n_timesteps, guidance,
            keep=keep_end - start, context_frames=context_frames,
        )  # fmt: skip
        if kv is not None and context is not None:
            needed = (keep_end - 1) // self.token_mel_ratio + self.lookahead + 1
            prefix = prefix.extended(start, kv, context, tokens, needed, context_frames)
        return mel.float(), prefix

    def prefix_nbytes(
        self, frames: int, n_timesteps: int = DEFAULT_N_TIMESTEPS, guidance: bool = True
    ) -> int:
        """`FlowPrefix.nbytes` of a prefix of `frames` frames: keys and values of every layer at every
        solver step (3.6 MB a frame for the full-size flow in float32) and the position context."""
        context = self.decoder.estimator.input_embed.conv_pos_embed.context_frames
        dtype = kv_dtype(self.spk_embed_affine_layer.weight)
        return prefix_nbytes(self.config.dit, frames, n_timesteps, guidance, dtype, context)

    def prepare_inputs(
        self,
        token: torch.Tensor,
        prompt_token: torch.Tensor,
        prompt_feat: torch.Tensor,
        embedding: torch.Tensor,
        finalize: bool,
    ) -> tuple[torch.Tensor, ...]:
        """Checked inputs -> tokens (1, Tp + T), noise (1, C, N), mu (1, C, N), spks (1, C), cond (1, C, N),
        on the parameters' device and dtype."""
        n_frames = self.check_inputs(token, prompt_token, prompt_feat, embedding, finalize)
        param = self.spk_embed_affine_layer.weight
        device, dtype = param.device, param.dtype
        tokens = torch.cat((prompt_token, token), dim=1).to(device=device, dtype=torch.long)
        spks = self.speaker_condition(embedding.to(device=device, dtype=dtype))
        mu = self.token_condition(tokens, finalize)
        cond = torch.zeros_like(mu)
        cond[:, :, : prompt_feat.shape[1]] = prompt_feat.to(device=device, dtype=dtype).transpose(1, 2)
        noise = start_noise(self.config.output_size, n_frames, device, dtype)
        return tokens, noise, mu, spks, cond
