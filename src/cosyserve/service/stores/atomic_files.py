"""Writing a file so that readers see the old content or the new, never half of it."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

TEMP_SUFFIX = ".tmp"  # leftovers of crashed writes end in this (retention removes old ones)


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a hidden temp file next to `path`, fsync, then rename over `path` (parents are made)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}")
    try:
        with open(temp, "xb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())  # else a power cut can leave an empty file under the final name
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
