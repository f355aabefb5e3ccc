"""Writing a file so that readers see the old content or the new, never half of it."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
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


def content_digest(content: bytes | Path) -> tuple[int, str]:
    """(size, sha256) of bytes, or of a file read in pieces (synced to disk first, as `write_atomic` does)."""
    if not isinstance(content, Path):
        return len(content), hashlib.sha256(content).hexdigest()
    digest = hashlib.sha256()
    with open(content, "rb+") as handle:
        os.fsync(handle.fileno())
        while piece := handle.read(1 << 20):
            digest.update(piece)
        return handle.tell(), digest.hexdigest()


def put_content(path: Path, content: bytes | Path) -> None:
    """Bytes written atomically to `path`, or a file written already moved there (across file systems,
    copied in pieces; the caller removes the source)."""
    if not isinstance(content, Path):
        write_atomic(path, content)
        return
    try:
        os.replace(content, path)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copyfile(content, path)
