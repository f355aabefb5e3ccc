"""Jobs' own timeouts: none by default for work that sets its own, renewed per segment, independent of the
interactive request timeout."""

from __future__ import annotations

import time

import pytest

from cosyserve.errors import JobTimeout
from cosyserve.service.scheduling.scheduler import Scheduler


def test_work_with_its_own_timeout_outlives_the_request_timeout() -> None:
    with Scheduler(concurrency=1, queue_size=2, request_timeout_s=0.3) as scheduler:

        def segments(ctx) -> int:
            for _ in range(6):  # 6 x 0.1 s: twice the request timeout, each step well within its own
                ctx.set_timeout(0.5, "a segment took too long")
                time.sleep(0.1)
            return 6

        assert scheduler.submit(segments, timeout_s=None).result(5) == 6
        interactive = scheduler.submit(lambda ctx: time.sleep(1.0))
        with pytest.raises(JobTimeout, match=r"0\.3 s request timeout"):
            interactive.result(5)


def test_a_stuck_segment_times_out_with_its_message() -> None:
    with Scheduler(concurrency=1, queue_size=2, request_timeout_s=60) as scheduler:

        def stuck(ctx) -> None:
            ctx.set_timeout(5.0, "first")
            ctx.set_timeout(0.2, "segment 2 ran longer than 0.2 s")  # replaces the first deadline
            ctx.cancel.wait(5)

        started = time.monotonic()
        with pytest.raises(JobTimeout, match="segment 2 ran longer"):
            scheduler.submit(stuck, timeout_s=None).result(5)
        assert time.monotonic() - started < 2
        with pytest.raises(JobTimeout, match=r"its 0\.2 s timeout"):
            scheduler.submit(lambda ctx: ctx.cancel.wait(5), timeout_s=0.2).result(5)
