"""Files a server writes are its own user's alone. The database and the signing secrets were already made
0600; the voices' recordings (biometric data), the outputs and their sidecars (every user's texts,
instructions and voice names) and the log file came out 0644 in 0755 folders, readable by every account
on the host. `serve` and `worker` take the group's and others' bits out of the file-creation mask before
they write anything (files they made before keep their modes: tighten them once by hand, see deploy.md).
"""

from __future__ import annotations

import os

PRIVATE_MASK = 0o077  # no read, write or search for the group and others


def keep_files_private() -> int:
    """Add `PRIVATE_MASK` to this process's file-creation mask; returns the mask it had."""
    previous = os.umask(PRIVATE_MASK)
    os.umask(previous | PRIVATE_MASK)
    return previous
