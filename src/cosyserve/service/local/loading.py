"""How the service loads its synthesizer: resolve the configured model (downloading it or writing the
demo model when needed), choose the engine options for the device, and load everything."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from cosyserve.engine.device import resolve_placement
from cosyserve.engine.pipeline import EngineOptions
from cosyserve.service.local.synthesizer import Synthesizer
from cosyserve.service.quality.asr import server_transcriber
from cosyserve.service.settings import Settings
from cosyserve.service.stores.voices import VoiceLibrary

log = logging.getLogger(__name__)

# settings, the service's voice library -> a loaded synthesizer using that library and the settings' limits
SynthesizerFactory = Callable[[Settings, VoiceLibrary], Synthesizer]


def load_synthesizer(settings: Settings, voices: VoiceLibrary | None) -> Synthesizer:
    """Resolve `settings.engine.model` (downloading or writing the demo model if needed) and load it."""
    from cosyserve.modeldir.resolve import resolve_model

    engine = settings.engine
    resolve_placement(engine.device, engine.precision)  # a device that isn't there fails before a download
    model_dir = resolve_model(
        engine.model, models_root=engine.models_dir, retry_budget_s=engine.download_retry_s
    )
    from cosyserve.frontend.text.lexicon import read_lexicon_file

    lexicon = read_lexicon_file(engine.lexicon) if engine.lexicon is not None else None
    return Synthesizer.load(
        model_dir,
        lexicon=lexicon,
        device=engine.device,
        precision=engine.precision,
        threads=engine.threads,
        voices=voices,
        max_text_chars=settings.limits.max_text_chars,
        engine_options=engine_options(settings),
        quality=settings.quality.policy(),
        transcriber=server_transcriber(engine.asr_model) if settings.quality.asr else None,
    )


def engine_options(settings: Settings) -> EngineOptions:
    """How the engine runs for these settings: batching/CUDA graphs on a GPU (unless turned off), the
    compute preset, and the flow speed options, which change the audio and are logged as such."""
    engine = settings.engine
    kind = device_type(engine.device)
    options = EngineOptions()
    if engine.gpu_batching:
        options = EngineOptions.for_device(kind, settings.resolve_concurrency(kind))
    if engine.flow_steps != options.flow_steps or not engine.flow_guidance:
        log.warning(
            "flow speed options are on (%d steps, guidance %s): the audio differs from the official "
            "outputs (`cosyserve bench --flow-steps/--no-cfg` reports by how much)",
            engine.flow_steps,
            "on" if engine.flow_guidance else "off",
        )
    return dataclasses.replace(
        options, flow_steps=engine.flow_steps, guidance=engine.flow_guidance, preset=engine.preset
    )


def device_type(spec: str) -> str:
    """ "cpu" or "cuda" for a device setting (auto: CUDA when present)."""
    if spec.startswith("cuda"):
        return "cuda"
    if spec == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cpu"
