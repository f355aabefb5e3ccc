"""Who may fetch the files the web UI hands to the page through Gradio's cache.

The page plays a result, a history entry, a batch item or a voice's own recording from a copy in
Gradio's cache (`generate.cache_copy`: a folder `cosy-<random>`), fetched by `/gradio_api/file=<path>`.
Gradio's file route asks only whether someone is signed in, so any signed-in user holding such a URL (from
a shared screen, a log, a browser's history on a shared computer) could fetch another user's audio,
a private voice's recording included, for as long as the copy lives (up to a day). Each copy is therefore
recorded with the owner it was made for, and the UI's auth dependency refuses the file to anyone else but
an admin (`login.ui_auth_dependency`). A copy the registry does not know (this process did not make it)
is refused to users too. Gradio puts an upload (a user's own recording to clone) in a folder named by its
content's keyed hash: the upload's answer is read on its way out (`UploadOwnerRecorder`) and its folder
recorded with whoever uploaded it, so another user holding its URL gets 404 too. Folders Gradio caches
itself (streamed chunks), and uploads this process did not see answered (before a restart), are left to
Gradio: their names are keyed hashes of their content, unknown without the URL.
"""

from __future__ import annotations

import json
import posixpath
import re
import threading
import uuid
from collections import OrderedDict
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote

from cosyserve.ui.bridge import Principal

FOLDER = re.compile(r"cosy-[0-9a-f]{32}")
UPLOAD_FOLDER = re.compile(r"[0-9a-f]{64}")  # Gradio's cache folders: a keyed sha256 of the content
MAX_FOLDERS = 100_000  # the oldest are forgotten first (Gradio removes their files within a day)
ANYONE = ""  # made for a caller without an owner (a server without logins): everyone may fetch it


class CachedFileOwners:
    """Cache folders and the owner each was made for. Thread-safe."""

    def __init__(self, max_folders: int = MAX_FOLDERS) -> None:
        self.max_folders = max_folders
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._uploads: OrderedDict[str, set[str]] = OrderedDict()  # upload folder -> who uploaded to it
        self._lock = threading.Lock()

    def record(self, folder: str, principal: Principal | None) -> None:
        owner = principal.owner if principal is not None else None
        with self._lock:
            self._owners[folder] = owner or ANYONE
            while len(self._owners) > self.max_folders:
                self._owners.popitem(last=False)

    def record_upload(self, folder: str, principal: Principal | None) -> None:
        """`folder` holds a file `principal` uploaded (two users uploading one file share the folder)."""
        owner = (principal.owner if principal is not None else None) or ANYONE
        with self._lock:
            self._uploads.setdefault(folder, set()).add(owner)
            self._uploads.move_to_end(folder)
            while len(self._uploads) > self.max_folders:
                self._uploads.popitem(last=False)

    def allows(self, principal: Principal, path: str) -> bool:
        """Whether `principal` may fetch the file at `path` (a `file=` route's path). The path is read as
        Gradio will open it (`..` resolved, %-escapes undone): `cosy-<mine>/../cosy-<yours>/x.wav` was
        checked against the first folder and served from the second."""
        if principal.is_admin:
            return True
        folders = served_folders(path)
        with self._lock:
            owners = [self._owners.get(folder) for folder in folders if FOLDER.fullmatch(folder)]
            uploaders = [self._uploads[folder] for folder in folders if folder in self._uploads]
        mine = all(owner == ANYONE or (owner is not None and owner == principal.owner) for owner in owners)
        return mine and all(ANYONE in who or principal.owner in who for who in uploaders)


def served_folders(path: str) -> tuple[str, ...]:
    """The folders of `path` as the file route resolves it: unquoted (twice, as a proxy may have), `..`
    and `.` resolved; the file's own name is not one (an upload may be named like a folder)."""
    for _ in range(2):
        path = unquote(path)
    return PurePosixPath(posixpath.normpath("/" + path.replace("\\", "/").lstrip("/"))).parent.parts[1:]


CACHE_OWNERS = CachedFileOwners()  # one per process, like Gradio's cache folder


def owned_folder(cache_dir: str | Path, principal: Principal | None) -> Path:
    """A fresh folder in Gradio's cache whose files only `principal` (and admins) may fetch."""
    name = f"cosy-{uuid.uuid4().hex}"
    CACHE_OWNERS.record(name, principal)
    folder = Path(cache_dir) / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class UploadOwnerRecorder:
    """ASGI middleware: records the folders of the files a Gradio upload (`POST …/gradio_api/upload`)
    answers with, as owned by the caller the UI's auth dependency found (`scope["state"]["ui_principal"]`)."""

    MAX_ANSWER = 1 << 20  # an upload's answer lists paths; anything larger is not one

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].endswith("/upload"):
            await self.app(scope, receive, send)
            return
        status, body = [0], bytearray()

        async def reading(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body" and status[0] == 200:
                body.extend(message.get("body", b"")[: self.MAX_ANSWER - len(body)])
                if not message.get("more_body"):
                    _record_answer(scope, bytes(body))
            await send(message)

        await self.app(scope, receive, reading)


def _record_answer(scope: dict, body: bytes) -> None:
    principal = (scope.get("state") or {}).get("ui_principal")
    try:
        paths = json.loads(body)
    except ValueError:
        return
    for path in paths if isinstance(paths, list) else ():
        folders = served_folders(path) if isinstance(path, str) else ()
        if folders and UPLOAD_FOLDER.fullmatch(folders[-1]):  # the folder Gradio put the file in
            CACHE_OWNERS.record_upload(folders[-1], principal)
