"""Building the three networks of a model directory with their weights, strictly checked, and placing
them on a device in the precisions the engine runs them in (`place_networks`: the service and
`cosyserve bench` both go through it, so the bench measures the networks the service runs).

Precisions with a reduced-precision placement (float16 / bfloat16 on a GPU):
- the speech LM: weights and KV cache in that dtype;
- the flow: float32 weights under autocast, except the DiT's linears and convolutions, cast to the
  dtype once here (autocast would otherwise re-cast ~185 M parameters at each of the 10 solver steps:
  in inference mode it caches no casts). The DiT's rotary `inv_freq`, the start noise, the time grid
  and the solver's state stay float32 (`flow_solver`);
- the vocoder: float32 (its F0 predictor float64), TF32 off (`device.float32_exact`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from cosyserve.engine.device import Placement
from cosyserve.engine.lm_layout import pack_speech_lm
from cosyserve.engine.native_activation import use_compiled_gelu
from cosyserve.engine.native_attention import use_native_attention
from cosyserve.engine.packed_dit import pack_dit_products
from cosyserve.model.checkpoint import load_into, read_state_dict
from cosyserve.model.flow import CausalFlow
from cosyserve.model.hift import HiFTVocoder
from cosyserve.model.no_init import NoRandomInit
from cosyserve.model.speech_lm import SpeechLM
from cosyserve.modeldir.model_dir import ModelDir

log = logging.getLogger(__name__)
CPU = torch.device("cpu")


def load_speech_lm(
    model_dir: ModelDir, device: torch.device = CPU, dtype: torch.dtype = torch.float32
) -> SpeechLM:
    """`llm.pt` → SpeechLM (memory-mapped weights, the unused 151k-row text LM head never kept)."""
    return SpeechLM.from_checkpoint(
        model_dir.file("llm.pt"), model_dir.config.llm, device=device, dtype=dtype
    )


def load_flow(
    model_dir: ModelDir, device: torch.device = CPU, dtype: torch.dtype = torch.float32
) -> CausalFlow:
    """`flow.pt` → CausalFlow (speech tokens → mel)."""
    with torch.device("meta"), NoRandomInit():  # no init runs (see SpeechLM.from_checkpoint)
        flow = CausalFlow(model_dir.config.flow)
    load_into(flow, read_state_dict(model_dir.file("flow.pt")), "flow.pt")
    return flow.to(device=device, dtype=dtype).eval().requires_grad_(False)


def load_hift(
    model_dir: ModelDir, device: torch.device = CPU, dtype: torch.dtype = torch.float32
) -> HiFTVocoder:
    """`hift.pt` → HiFTVocoder. Kept in float32 whatever the engine dtype: reduced precision hurts F0."""
    del dtype
    vocoder = HiFTVocoder.from_state_dict(model_dir.config.hift, read_state_dict(model_dir.file("hift.pt")))
    return vocoder.to(device=device).requires_grad_(False)


def cast_dit_products(flow: CausalFlow, dtype: torch.dtype) -> int:
    """Cast the weights of the DiT's linears and convolutions to `dtype` in place; return how many
    parameters were cast. Buffers (the rotary `inv_freq`) and the rest of the flow are left as they are."""
    cast = 0
    for module in flow.decoder.estimator.modules():
        if isinstance(module, (nn.Linear, nn.Conv1d)):
            module.to(dtype=dtype)
            cast += sum(p.numel() for p in module.parameters(recurse=False))
    return cast


def place_speech_lm(model: SpeechLM, placement: Placement, *, pack: bool = True) -> SpeechLM:
    """The LM on the placement's device and dtype. On the CPU in float32 its decoding products are
    then held in the layouts this machine reads fastest (`lm_layout.pack_speech_lm`, exact: the same
    log-probs to float rounding); `pack=False` leaves them (e.g. when a fast preset repacks them next).
    There, too, each decoding step's attention runs compiled where it can (`native_attention`, the
    same values to float rounding)."""
    model = model.to(device=placement.device, dtype=placement.dtype)
    if placement.device.type == "cpu" and placement.dtype == torch.float32 and use_native_attention(model):
        log.info("LM attention for one new position: compiled (native_attention)")
    if pack and placement.device.type == "cpu" and placement.dtype == torch.float32:
        report = pack_speech_lm(model, "exact")
        if report.choices:
            log.info(
                "LM products: %s (calibration %.1f s, layouts %.1f s)",
                report.label(),
                report.measure_seconds,
                report.pack_seconds,
            )
    return model


def place_flow(flow: CausalFlow, placement: Placement, *, pack: bool = False) -> CausalFlow:
    """The flow on the placement's device: float32, its DiT's products in the reduced dtype if any.
    On the CPU in float32 the DiT's feed-forward GELU runs compiled where it can (`native_activation`,
    the same values to a few ulp), and with `pack` (the exact preset: a preset converts the linears
    itself) its products on oneDNN-packed weights where this machine runs them faster (`packed_dit`)."""
    flow = flow.to(device=placement.device)
    if placement.autocast_enabled:
        cast_dit_products(flow, placement.dtype)
        return flow
    if placement.device.type == "cpu" and use_compiled_gelu(flow.decoder.estimator):
        log.info("DiT feed-forward GELU: compiled (native_activation)")
    if placement.device.type == "cpu" and pack and (packed := pack_dit_products(flow.decoder.estimator)):
        log.info("DiT products: %d linears on oneDNN-packed weights", packed)
    return flow


def place_hift(hift: HiFTVocoder, placement: Placement) -> HiFTVocoder:
    """The vocoder on the placement's device, float32 whatever the placement's dtype."""
    return hift.to(device=placement.device)


def place_networks(
    llm: SpeechLM, flow: CausalFlow, hift: HiFTVocoder, placement: Placement, *, pack_lm: bool = True
) -> tuple[SpeechLM, CausalFlow, HiFTVocoder]:
    """All three networks placed as the engine runs them (see the module docstring); `pack_lm` (the
    exact preset): see `place_speech_lm`, and the DiT's products in `place_flow`."""
    return (
        place_speech_lm(llm, placement, pack=pack_lm),
        place_flow(flow, placement, pack=pack_lm),
        place_hift(hift, placement),
    )


def network_dtypes(
    llm: SpeechLM, flow: CausalFlow, hift: HiFTVocoder, placement: Placement
) -> dict[str, str]:
    """The dtype each part computes and keeps its state in, by name (for /ready and reports)."""
    dit = flow.decoder.estimator
    compute = placement.dtype_name if placement.autocast_enabled else "float32"
    return {
        "lm_weights": _name(llm.speech_embedding.weight.dtype),
        "lm_kv_cache": _name(llm.speech_embedding.weight.dtype),
        "lm_log_probs": "float32",
        "flow_weights": _name(flow.spk_embed_affine_layer.weight.dtype),
        "flow_dit_products": _name(dit.proj_out.weight.dtype),
        "flow_compute": compute,
        "flow_rotary_inv_freq": _name(dit.rotary_embed.inv_freq.dtype),
        "flow_start_noise": _name(flow.start_noise.dtype),
        "flow_solver_state": "float32",
        "vocoder": _name(next(hift.parameters()).dtype),
        "vocoder_convolutions": _name(next(hift.ups.parameters()).dtype),  # bfloat16: the fast preset's
        "vocoder_f0": "float64",
        "vocoder_tf32": "off" if placement.device.type == "cuda" else "n/a",
    }


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


CHECKPOINT_LOADERS: dict[str, Callable[[ModelDir], nn.Module]] = {
    "llm.pt": load_speech_lm,
    "flow.pt": load_flow,
    "hift.pt": load_hift,
}
