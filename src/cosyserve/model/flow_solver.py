"""The flow's ODE solver: conditional flow matching with the DiT velocity field (Euler steps on a
cosine time schedule, classifier-free guidance).

Precision: the time grid and the Euler state stay float32 whatever the DiT computes in (float16 under
autocast on a GPU): the state accumulates ten small steps, and t feeds the sinusoids of the DiT's time
embedding, which a half-precision t would round.

Shapes: B batch rows, C mel channels (80), N mel frames, S solver steps, L DiT layers, R guidance rows
(2 with guidance: conditioned, unconditioned; else 1), H heads, Dh head width, D model width.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch

from cosyserve.errors import ConfigError
from cosyserve.model.config import CFMConfig, DiTConfig
from cosyserve.model.dit import DiT
from cosyserve.model.interrupt import checkpoint

DEFAULT_N_TIMESTEPS = 10  # Euler steps the official inference uses
TIME_DTYPE = torch.float32  # the time grid and the Euler state (see the module docstring)


def past_for_step(
    past_kv: Sequence[torch.Tensor], step: int, layers: int
) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """Per layer, the key and value segments (R, H, Ti, Dh) of solver step `step`, from blocks
    (S, L, 2, R, H, Ti, Dh) of earlier frames in order."""
    return [
        ([kv[step, layer, 0] for kv in past_kv], [kv[step, layer, 1] for kv in past_kv])
        for layer in range(layers)
    ]


class CausalCFM(torch.nn.Module):
    """Conditional flow matching sampler around the DiT estimator (Euler, cosine time schedule, CFG)."""

    def __init__(self, cfm: CFMConfig, dit: DiTConfig) -> None:
        super().__init__()
        if cfm.solver != "euler":
            raise ConfigError(f"flow solver {cfm.solver!r} in the YAML is not supported; use 'euler'")
        self.cfg_rate = cfm.inference_cfg_rate
        self.t_scheduler = cfm.t_scheduler
        self.estimator = DiT(dit)
        # With `keep_time_conditioning`, the last pass's `_step_times` and what they were computed
        # from: a pass with the same steps and rows reuses them (22 layers' modulation weights, 0.55 GB
        # in float32 at full size, are read once instead of once per pass: ~55 ms of each streaming
        # chunk pass on 2 cores).
        self._keep_times = False
        self._times_kept: tuple[tuple[object, ...], list[list[torch.Tensor]]] | None = None

    def keep_time_conditioning(self, keep: bool = True) -> None:
        """Reuse the time modulation across passes (for weights that no longer change in place: the
        engine's, once placed; a replaced module is noticed). Turning it off, or on again, forgets it."""
        self._keep_times, self._times_kept = keep, None

    def estimate(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
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
        mask: torch.Tensor | None,
        spks: torch.Tensor,
        cond: torch.Tensor,
        streaming: bool,
        n_timesteps: int = DEFAULT_N_TIMESTEPS,
        guidance: bool = True,
    ) -> torch.Tensor:
        """Integrate from `noise` (B, C, N) to a mel (B, C, N); B = 1 except for batched requests.

        mu, cond: (B, *, N); mask: (B, 1, N), zero on padding frames, or None when every frame is valid;
        spks: (B, spk_dim). Each step runs the estimator on the conditioned rows and the unconditioned
        ones (mu, spks, cond zeroed); the guided velocity is (1 + r) * v_cond - r * v_uncond.
        guidance=False (a speed option, not the official output) runs the conditioned rows alone and
        steps with v_cond.
        """
        mask_in = torch.cat((mask, mask)) if guidance and mask is not None else mask
        mu_in, spks_in, cond_in = _with_unconditioned(mu, spks, cond) if guidance else (mu, spks, cond)
        steps = list(self.euler_times(n_timesteps, mu.device))
        times = self._step_times(steps, mu_in.shape[0])
        x = noise
        for step, (t, dt) in enumerate(steps):
            checkpoint()  # a cancelled request's pass stops here, not after every step
            x_in = torch.cat((x, x)) if guidance else x
            velocity = self.estimate(
                x_in, mask_in, mu_in, t.expand(x_in.shape[0]), spks_in, cond_in, streaming, times[step]
            )
            x = self._step(x, dt, velocity, guidance)
        return x

    def solve_continued(
        self,
        noise: torch.Tensor,
        mu: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
        start: int,
        past_kv: Sequence[torch.Tensor] = (),
        embed_context: torch.Tensor | None = None,
        n_timesteps: int = DEFAULT_N_TIMESTEPS,
        guidance: bool = True,
        keep: int = 0,
        context_frames: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """`solve` with chunked attention for frames start .. start + T - 1, the frames before them
        given by their keys and values `past_kv` (blocks (S, L, 2, R, H, Ti, Dh) in order; none when
        start is 0) and the projected inputs of the last of them, `embed_context` (S, R, Tc, D).

        noise, mu, cond: (1, *, T) of those frames; spks: (1, spk_dim). Returns the mel (1, C, T) and,
        for the first `keep` of these frames only, their keys and values at every solver step and layer
        in one block (S, L, 2, R, H, keep, Dh), written as the pass goes, and the projected inputs of
        the last `context_frames` of them (S, R, Tc, D); both None when keep is 0.
        """
        mu_in, spks_in, cond_in = _with_unconditioned(mu, spks, cond) if guidance else (mu, spks, cond)
        estimator = self.estimator
        depth = len(estimator.transformer_blocks)
        kv = None
        if keep:
            dit = estimator.config
            shape = (n_timesteps, depth, 2, mu_in.shape[0], dit.heads, keep, dit.dim_head)
            kv = torch.empty(shape, device=mu.device, dtype=estimator.kv_dtype())
        contexts = []
        steps = list(self.euler_times(n_timesteps, mu.device))
        times = self._step_times(steps, mu_in.shape[0])
        x = noise
        for step, (t, dt) in enumerate(steps):
            checkpoint()
            past = past_for_step(past_kv, step, depth)
            context = None if embed_context is None else embed_context[step]
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
        self, n_timesteps: int, device: torch.device, dtype: torch.dtype = TIME_DTYPE
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

    def _step_times(
        self, steps: list[tuple[torch.Tensor, torch.Tensor]], rows: int
    ) -> list[list[torch.Tensor]]:
        """Per solver step, `DiT.time_conditioning` of its time for `rows` rows, computed for all steps
        at once (each layer's modulation weights are read once per pass, not once per step) and kept
        for the next pass with the same steps (`euler_times` of the same count: the same times), rows,
        device, precision and modules when `keep_time_conditioning` is on. Callers only read it."""
        if not self._keep_times:
            return self._times_for(steps, rows)
        device = steps[0][0].device
        autocast = torch.amp.is_autocast_available(device.type) and torch.is_autocast_enabled(device.type)
        key = (
            len(steps), rows, device, autocast and torch.get_autocast_dtype(device.type),
            torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            self.estimator.time_conditioning_modules(),
        )  # fmt: skip
        kept = self._times_kept
        if kept is not None and kept[0] == key:
            return kept[1]
        times = self._times_for(steps, rows)
        self._times_kept = (key, times)
        return times

    def _times_for(
        self, steps: list[tuple[torch.Tensor, torch.Tensor]], rows: int
    ) -> list[list[torch.Tensor]]:
        per_layer = self.estimator.time_conditioning(
            torch.stack([t for t, _ in steps])[:, None].expand(-1, rows)
        )
        return [[layer[step] for layer in per_layer] for step in range(len(steps))]

    def _step(
        self, x: torch.Tensor, dt: torch.Tensor, velocity: torch.Tensor, guidance: bool = True
    ) -> torch.Tensor:
        """One Euler step; guided from the conditioned and unconditioned halves of `velocity`. The
        state keeps its dtype (float32) whatever the velocity's."""
        velocity = velocity.to(x.dtype)  # a no-op unless the DiT computes in half precision
        if not guidance:
            return x + dt * velocity
        v_cond, v_uncond = velocity.chunk(2, dim=0)
        return x + dt * ((1.0 + self.cfg_rate) * v_cond - self.cfg_rate * v_uncond)


def _with_unconditioned(
    mu: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batch of two for classifier-free guidance: the conditions, then zeros."""
    return tuple(torch.cat((c, torch.zeros_like(c))) for c in (mu, spks, cond))
