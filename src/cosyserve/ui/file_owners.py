"""Who may fetch the files the web UI hands to the page through Gradio's cache.

The page plays a result, a history entry, a batch item or a voice's own recording from a copy in
Gradio's cache (`generate.cache_copy`: a folder `cosy-<random>`), fetched by `/gradio_api/file=<path>`.
Gradio's file route asks only whether someone is signed in, so any signed-in user holding such a URL (from
a shared screen, a log, a browser's history on a shared computer) could fetch another user's audio,
a private voice's recording included, for as long as the copy lives (up to a day). Each copy is therefore
recorded with the owner it was made for, and the UI's auth dependency refuses the file to anyone else but
an admin (`login.ui_auth_dependency`). A copy the registry does not know (this process did not make it)
is refused to users too. Files Gradio caches itself (uploads, streamed chunks) live in folders named by
their content's hash, and are left to Gradio.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections import OrderedDict
from pathlib import Path

from cosyserve.ui.bridge import Principal

FOLDER = re.compile(r"/(cosy-[0-9a-f]{32})/")
MAX_FOLDERS = 100_000  # the oldest are forgotten first (Gradio removes their files within a day)
ANYONE = ""  # made for a caller without an owner (a server without logins): everyone may fetch it


class CachedFileOwners:
    """Cache folders and the owner each was made for. Thread-safe."""

    def __init__(self, max_folders: int = MAX_FOLDERS) -> None:
        self.max_folders = max_folders
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, folder: str, principal: Principal | None) -> None:
        owner = principal.owner if principal is not None else None
        with self._lock:
            self._owners[folder] = owner or ANYONE
            while len(self._owners) > self.max_folders:
                self._owners.popitem(last=False)

    def allows(self, principal: Principal, path: str) -> bool:
        """Whether `principal` may fetch the file at `path` (a `file=` route's path)."""
        found = FOLDER.search("/" + path.lstrip("/") if path else "")
        if found is None or principal.is_admin:
            return True
        with self._lock:
            owner = self._owners.get(found.group(1))
        return owner == ANYONE or (owner is not None and owner == principal.owner)


CACHE_OWNERS = CachedFileOwners()  # one per process, like Gradio's cache folder


def owned_folder(cache_dir: str | Path, principal: Principal | None) -> Path:
    """A fresh folder in Gradio's cache whose files only `principal` (and admins) may fetch."""
    name = f"cosy-{uuid.uuid4().hex}"
    CACHE_OWNERS.record(name, principal)
    folder = Path(cache_dir) / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder
