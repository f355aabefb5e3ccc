"""Where a batch item becomes a request: an item's typed parameters and the one conversion to a
`SynthesisRequest`, used by the server's runner (`local.batches`, which the cluster's workers run too)
and by `cosyserve batch` / `cosyserve dub`.

An item's parameters are stored as a mapping (`BatchStore`, `ItemSpec.params`: checked by `inputs`, shared
settings filled in, a dub's cue times added); `ItemParams.of` reads the synthesis part of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cosyserve.service.requests import SynthesisRequest


@dataclass(frozen=True)
class ItemParams:
    """What one item asks to be spoken, and how."""

    text: str
    voice: str | None = None  # a saved voice; None: the batch's uploaded recording
    instruct: str | None = None
    seed: int | None = None
    speed: float | None = None  # None: the voice's own, or 1
    volume: float = 1.0  # linear gain on the output
    format: str = "wav"  # the item's file format
    takes: int | None = None  # None: the server's
    thresholds: dict[str, float] | None = field(default=None, hash=False)  # None: the server's

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> ItemParams:
        """The parameters of a checked item (`inputs.ItemSpec.params`, `BatchItem.params`)."""
        volume = params.get("volume")
        return cls(
            text=str(params.get("text") or ""),
            voice=params.get("voice"),
            instruct=params.get("instruct"),
            seed=params.get("seed"),
            speed=params.get("speed"),
            volume=float(volume) if volume is not None else 1.0,
            format=str(params.get("format") or "wav"),
            takes=params.get("takes"),
            thresholds=dict(params["thresholds"]) if params.get("thresholds") else None,
        )


@dataclass(frozen=True)
class BatchPrompt:
    """The batch's uploaded recording (and its transcript): the voice of every item that names none."""

    wav: bytes | None = None
    text: str | None = None


def item_request(params: ItemParams, prompt: BatchPrompt) -> SynthesisRequest:
    """The synthesis an item asks for: its own voice, else the batch's uploaded recording."""
    own_voice = bool(params.voice)
    return SynthesisRequest(
        text=params.text,
        voice=params.voice,
        prompt_wav=None if own_voice else prompt.wav,
        prompt_text=None if own_voice else prompt.text,
        instruct=params.instruct,
        seed=params.seed,
        speed=params.speed,
        volume=params.volume,
        takes=params.takes,
        thresholds=params.thresholds,
    )


def batch_request(shared: Mapping[str, Any], items: Iterable[Mapping[str, Any]]) -> SynthesisRequest:
    """A whole batch as one request (for the activity log and a dub's manifest): its texts, one a line,
    its shared voice and instruction."""
    text = "\n".join(str(params.get("text") or "") for params in items)
    return SynthesisRequest(
        text=text,
        voice=shared.get("voice"),
        instruct=shared.get("instruct"),
        prompt_text=shared.get("prompt_text"),  # a recording's transcript: zero-shot, as its items say
    )
