"""One single server per data directory.

A single server owns its jobs: at start it puts back in the queue whatever its database says was running
(an earlier process of it died). A second server started on the same data directory read the first one's
running job as left behind, ran it a second time and charged its key twice. `hold_data_dir` takes an
exclusive lock on `<data dir>/server.lock` for the server's lifetime (the system drops it when the process
ends, a crash included) and refuses a second one. Servers of a cluster (`--queue`) share their database
on purpose and take no lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from cosyserve.errors import InputError

LOCK_NAME = "server.lock"


def hold_data_dir(data_dir: Path) -> IO[str]:
    """The open lock file (keep it for as long as the server runs); InputError when another server holds
    the directory."""
    data_dir.mkdir(parents=True, exist_ok=True)
    handle = open(data_dir / LOCK_NAME, "a+", encoding="utf-8")  # noqa: SIM115 (held until exit)
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise InputError(
            f"another cosyserve server ({holder}) serves {data_dir}: stop it, or give this one its own "
            "--data-dir (servers that share one database run as a cluster: --queue, docs/deploy.md)"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle
