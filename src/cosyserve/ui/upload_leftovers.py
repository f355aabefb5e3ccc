"""Partial uploads the web UI's hung-up clients left behind are removed.

Gradio writes an upload's body to a temporary file (`tmp…`) in its upload folder and moves it into a
folder of its own once the body has arrived; a client that hangs up mid-upload leaves the temporary
file, which nothing tracks: its `delete_cache` removes the files it knows of, retention looks at outputs
only. A signed-in user (or a tab closed mid-upload) leaked up to `--max-upload-mb` each time, for ever.
A daemon thread removes such files once they are older than any upload still arriving can be (the body
rate floor cuts off a body slower than 32 kB/s, so even the largest upload is in well within the hour).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

LEFTOVER_AGE_S = 2 * 3600.0
SWEEP_EVERY_S = 600.0


def remove_partial_uploads(
    folder: Path, older_than_s: float = LEFTOVER_AGE_S, now: float | None = None
) -> int:
    """Remove the temporary files of unfinished uploads (`tmp*` files directly in `folder`) older than
    `older_than_s`; returns how many went. Finished uploads live in sub-folders and are left alone."""
    now = time.time() if now is None else now
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        for path in folder.iterdir():
            if not path.name.startswith("tmp") or path.is_symlink() or not path.is_file():
                continue
            with contextlib.suppress(FileNotFoundError):
                if now - path.stat().st_mtime > older_than_s:
                    path.unlink()
                    removed += 1
    return removed


_SWEPT: set[Path] = set()  # folders a thread of this process sweeps already (one app, or many in tests)
_SWEPT_LOCK = threading.Lock()


def start_sweeping(folder: Path, every_s: float = SWEEP_EVERY_S) -> bool:
    """Start a daemon thread that calls `remove_partial_uploads(folder)` every `every_s` seconds, unless
    one sweeps `folder` already; returns whether it started one."""
    with _SWEPT_LOCK:
        if folder in _SWEPT:
            return False
        _SWEPT.add(folder)

    def sweep() -> None:
        while True:
            try:
                if removed := remove_partial_uploads(folder):
                    log.info("removed %d partial uploads left by clients that hung up", removed)
            except OSError as exc:  # an unreadable folder: said, and tried again later
                log.warning("could not look for partial uploads in %s: %s", folder, exc)
            time.sleep(every_s)

    threading.Thread(target=sweep, name="cosyserve-upload-leftovers", daemon=True).start()
    return True
