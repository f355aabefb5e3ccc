"""A file answer that holds its file open from the moment it is made.

Starlette's `FileResponse` opens its path only as it sends: a result or a voice deleted (or expired by
retention) between the lookup and the send answered 500, and one deleted while it was being sent broke
off after its headers had promised the whole length. Opened first, a file removed afterwards is still
sent whole (its data lives until the last descriptor closes); one already gone is the caller's 404.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastapi.responses import FileResponse

DESCRIPTORS = Path("/dev/fd")  # a path that opens an open descriptor's file (Linux, macOS)


class HeldFileResponse(FileResponse):
    """`FileResponse` of a file opened now. FileNotFoundError when it is already gone."""

    def __init__(self, path: str | os.PathLike[str], **kwargs: Any) -> None:
        self._fd: int | None = os.open(path, os.O_RDONLY)
        held = DESCRIPTORS / str(self._fd)
        super().__init__(held if DESCRIPTORS.is_dir() else path, **kwargs)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.close()

    def close(self) -> None:
        fd, self._fd = getattr(self, "_fd", None), None  # (none when the open failed)
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:  # an answer made but never sent (the request failed after it)
        self.close()
