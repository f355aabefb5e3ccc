"""A synthesis' guard against its key changing under it: progress on its ticket, and the key checked after
every segment and before every streamed chunk (revoked: stop; role changed: stop if its voice is no
longer the key's to use)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from cosyserve.errors import Cancelled
from cosyserve.service.access.key_watch import KeyChanged, KeyRevoked, KeyWatch
from cosyserve.service.local.synthesizer import SynthesisStream
from cosyserve.service.outcomes import SynthesisProgress
from cosyserve.service.requests import OutputSpec
from cosyserve.service.scheduling.scheduler import WorkContext
from cosyserve.service.stores.keys import ApiKey


class KeyGuard:
    """A synthesis' progress callback: reports progress on its ticket (the UI's progress bar) and checks
    its key after every segment (KeyRevoked / KeyChanged end it at that boundary)."""

    def __init__(
        self,
        ctx: WorkContext,
        watch: KeyWatch,
        quota_at_start: Callable[[ApiKey], None] | None = None,
        *,
        stage: str = "request",
    ) -> None:
        self.ctx, self.watch = ctx, watch
        self.stage = stage  # "request" (one answer: nothing kept) or "chunk" (a stream): what a stop says
        self.quota_at_start = quota_at_start  # QuotaExceeded when the key's quota is used up as work starts
        self.stream: SynthesisStream | None = None  # set once the synthesis is planned: its voice
        self.cleared_s = 0.0  # audio made before the last check that passed: what a stop still charges

    def __call__(self, progress: SynthesisProgress) -> None:
        self.ctx.set_progress(progress.fraction)
        if progress.segments_done > 0:
            voice = self.stream.voice if self.stream is not None else None
            self.watch.check([voice] if voice is not None else [], stage=self.stage)
            if progress.kept:  # of several takes, only the delivered one is charged
                self.cleared_s = progress.audio_seconds

    def check_streamed(self, sent_s: float) -> None:
        """Before a stream hands its client the next chunk: the key checked again (a one-segment text is
        streamed in many chunks; checked only between segments, a revoked key kept streaming to its end),
        and the `sent_s` seconds handed over before it are what a stop charges."""
        self.cleared_s = max(self.cleared_s, sent_s)  # the client has it: charged whatever the check says
        voice = self.stream.voice if self.stream is not None else None
        self.watch.check([voice] if voice is not None else [], stage="chunk")

    def check_at_start(self) -> None:
        """KeyRevoked for a key revoked while the work waited in the queue, QuotaExceeded for one whose
        quota was used up (or lowered below its usage) meanwhile: it gets no engine time and sends nothing
        (the checks after each segment catch a revoke during the work)."""
        key = self.watch.check(stage="start")
        if key is not None and self.quota_at_start is not None:
            self.quota_at_start(key)

    @contextlib.contextmanager
    def charging_what_was_made(
        self,
        settle: Callable[[OutputSpec, float], None],
        spec: OutputSpec,
        count: Callable[[float], object],
    ) -> Iterator[None]:
        """A stop for the key charges the segments made before it (the rest were made after the revoke),
        settling its reservation with them and `count`ing them (the metrics' audio seconds: they missed
        what such a stop charged); with none made the reservation is given back as it ends."""
        try:
            yield
        except (KeyRevoked, KeyChanged):
            if spec.key is not None and self.cleared_s > 0:
                settle(spec, self.cleared_s)
                count(self.cleared_s)
            raise


class SentAudio:
    """The audio a stream has handed to its client so far, charged if the client leaves before the end: a
    hang-up or a cancel must not make what was already sent free (a stream that ends normally is settled
    with its whole length by `Results.finish`; one stopped for its key by `charging_what_was_made`).

    What counts is what the reader took (`taken()`: items it took from the ticket's buffer), not what was
    put in that buffer: a client that hung up was charged the chunks still waiting there (7.5 s charged,
    4.9 s received)."""

    def __init__(self, sample_rate: int, taken: Callable[[], int]) -> None:
        self.sample_rate = sample_rate
        self.samples = 0  # handed to the ticket's buffer
        self.taken = taken
        self._marks: list[tuple[int, int]] = []  # (the item's number among all yielded, samples through it)

    def handed(self, samples: int, item_number: int) -> None:
        """`samples` more went out as the stream's `item_number`-th item (from 1: its start is the first)."""
        self.samples += samples
        self._marks.append((item_number, self.samples))

    @property
    def read_s(self) -> float:
        """Seconds of audio in the items the reader took."""
        taken = self.taken()
        read = max((samples for number, samples in self._marks if number <= taken), default=0)
        return read / self.sample_rate

    @contextlib.contextmanager
    def charged_if_left(
        self,
        settle: Callable[[OutputSpec, float], None],
        spec: OutputSpec,
        count: Callable[[float], None] = lambda seconds: None,
    ) -> Iterator[None]:
        """Settles (and `count`s, for the metrics) what was read, when the stream ends early."""
        try:
            yield
        except (Cancelled, GeneratorExit):
            seconds = self.read_s
            if seconds > 0:
                count(seconds)
                if spec.key is not None:
                    settle(spec, seconds)
            raise
