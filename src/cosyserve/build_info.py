"""Which code is running: the release number alone names 500 commits of schema and behaviour changes.

`source_digest()` is a short SHA-256 over the package's own Python files (their paths and bytes), the
same for every install of one source tree (a Docker image, a wheel, an editable checkout) and different
after any change: `cosyserve --version` and `/health` show it, so an upgrade can be confirmed by it.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from cosyserve import __version__

PACKAGE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """12 hex digits naming the package's source (about 10 ms, once per process)."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def version_line() -> str:
    """`cosyserve 0.1.0 (source 1a2b3c4d5e6f)`."""
    return f"cosyserve {__version__} (source {source_digest()})"
