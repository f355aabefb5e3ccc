"""A synthesis' guard against its key changing under it: progress on its ticket, and the key checked after
every segment (revoked: stop; role changed: stop if its voice is no longer the key's to use)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from cosyserve.service.access.key_watch import KeyChanged, KeyRevoked, KeyWatch
from cosyserve.service.local.synthesizer import SynthesisStream
from cosyserve.service.outcomes import SynthesisProgress
from cosyserve.service.requests import OutputSpec
from cosyserve.service.scheduling.scheduler import WorkContext


class KeyGuard:
    """A synthesis' progress callback: reports progress on its ticket (the UI's progress bar) and checks
    its key after every segment (KeyRevoked / KeyChanged end it at that boundary)."""

    def __init__(self, ctx: WorkContext, watch: KeyWatch) -> None:
        self.ctx, self.watch = ctx, watch
        self.stream: SynthesisStream | None = None  # set once the synthesis is planned: its voice
        self.cleared_s = 0.0  # audio made before the last check that passed: what a stop still charges

    def __call__(self, progress: SynthesisProgress) -> None:
        self.ctx.set_progress(progress.fraction)
        if progress.segments_done > 0:
            voice = self.stream.voice if self.stream is not None else None
            self.watch.check([voice] if voice is not None else [])
            self.cleared_s = progress.audio_seconds

    @contextlib.contextmanager
    def charging_what_was_made(
        self, settle: Callable[[OutputSpec, float], None], spec: OutputSpec
    ) -> Iterator[None]:
        """A stop for the key charges the segments made before it (the rest were made after the revoke),
        settling its reservation with them; with none made the reservation is given back as it ends."""
        try:
            yield
        except (KeyRevoked, KeyChanged):
            if spec.key is not None and self.cleared_s > 0:
                settle(spec, self.cleared_s)
            raise
