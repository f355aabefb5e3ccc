"""Batched flow across requests: several requests' one-shot token → mel as one padded DiT batch.

Each request's inputs (token condition, prompt mel, speaker, start noise) are prepared alone, then
padded at the end to the longest request's frames with a zero frame mask on the padding. Padding never
changes a real frame: the DiT's position convolutions look only back, its attention masks padded keys,
and everything else works frame by frame. With guidance the solver doubles the batch as usual
(conditioned rows, then unconditioned). Each request gets the mel `CausalFlow.inference(...,
streaming=False, finalize=True)` gives it alone, up to float rounding.

`FlowBatcher` gathers concurrent calls into such batches (a caller arriving while the flow is busy
waits and then runs together with the others that arrived meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F

from cosyserve.engine.decode_batching import Rendezvous
from cosyserve.engine.flow_stream import FlowPrompt
from cosyserve.model.flow import DEFAULT_N_TIMESTEPS, CausalFlow
from cosyserve.model.interrupt import uninterruptible

FlowJob = tuple[torch.Tensor, FlowPrompt]  # tokens (1, T), the request's prompt


@torch.inference_mode()
def batched_flow_mels(
    flow: CausalFlow,
    jobs: Sequence[FlowJob],
    *,
    n_timesteps: int = DEFAULT_N_TIMESTEPS,
    guidance: bool = True,
) -> list[torch.Tensor]:
    """One-shot, finalized mels of several requests in one solver run: per job (1, C, N_i - Tm_i)
    float32 (the frames after its prompt), as `flow.inference` gives for that job alone."""
    if not jobs:
        return []
    prepared = [
        flow.prepare_inputs(tokens, p.speech_token, p.speech_feat, p.embedding, finalize=True)
        for tokens, p in jobs
    ]
    frames = [inputs.frames for inputs in prepared]
    longest = max(frames)

    def padded(field: str) -> torch.Tensor:
        tensors = [getattr(inputs, field) for inputs in prepared]
        return torch.cat([F.pad(t, (0, longest - t.shape[2])) for t in tensors])

    noise, mu, cond = padded("noise"), padded("mu"), padded("cond")
    spks = torch.cat([inputs.spks for inputs in prepared])
    # Built on the host from the known lengths and copied once (no device work to read back).
    mask = torch.zeros(len(frames), 1, longest, dtype=noise.dtype)
    for row, count in enumerate(frames):
        mask[row, :, :count] = 1
    mask = mask.to(noise.device, non_blocking=True)
    with uninterruptible():  # several requests' pass: one's cancel must not fail the others
        mel = flow.decoder.solve(noise, mu, mask, spks, cond, False, n_timesteps, guidance)
    return [
        mel[row : row + 1, :, prompt.speech_feat.shape[1] : count].float()
        for row, ((_, prompt), count) in enumerate(zip(jobs, frames, strict=True))
    ]


class FlowBatcher(Rendezvous[FlowJob, torch.Tensor]):
    """Runs concurrent one-shot flow calls as padded batches of up to `max_batch` requests.

    `window_s` 0 (the default) never delays a lone request: batches form from the calls that arrive
    while a batch runs. `autocast` is entered around each batch (the running thread's own state).
    Requests are independent, so a batch that runs out of memory is retried in halves.
    """

    split_on_oom = True

    def __init__(
        self,
        flow: CausalFlow,
        *,
        n_timesteps: int = DEFAULT_N_TIMESTEPS,
        guidance: bool = True,
        max_batch: int = 4,
        window_s: float = 0.0,
        autocast: Callable[[], AbstractContextManager[object]] = nullcontext,
    ) -> None:
        super().__init__(max_batch=max_batch, window_s=window_s)
        self.flow = flow
        self.n_timesteps = n_timesteps
        self.guidance = guidance
        self.autocast = autocast

    def mel(self, tokens: torch.Tensor, prompt: FlowPrompt) -> torch.Tensor:
        """The one-shot mel (1, C, frames) of `tokens` (1, T) after `prompt`, batched with concurrent calls.

        Raises InputError for unusable inputs (checked here, so one request cannot fail the others'
        batch), OutOfMemory when this request does not fit even alone, and BatchError when the batch
        fails otherwise (in every caller's thread).
        """
        self.flow.check_inputs(tokens, prompt.speech_token, prompt.speech_feat, prompt.embedding, True)
        return self.submit((tokens, prompt))

    def run_batch(self, items: list[FlowJob]) -> list[torch.Tensor]:
        with self.autocast():
            return batched_flow_mels(self.flow, items, n_timesteps=self.n_timesteps, guidance=self.guidance)
