"""The voices' files: each voice's original recording and `features.npz` (speaker embedding, prompt speech
tokens, prompt mel), kept as blobs in the database and copied to each node's disk when used.

Several nodes share one database but not a filesystem, so the files live in the table `voice_files`
(written in the same transaction as the voice row), and `<root>/<voice id>/` is each node's local copy of
them: `VoiceFiles.refresh` brings a copy up to date (missing, or its sha256 differs from the database's)
before it is used. Local files are hashed again only when their size, mtime or inode changed.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa
import torch

from cosyserve.frontend.prompt_features import PromptFeatures
from cosyserve.service.stores.atomic_files import write_atomic
from cosyserve.service.stores.db import table

FEATURES_FILE = "features.npz"


def voice_files_table(metadata: sa.MetaData) -> sa.Table:
    """The voices' files (recording, features) as blobs: what every node copies its local files from.
    Its foreign key names the `voices` table, which must be defined on the same metadata before either
    is created (`VoiceLibrary` does that)."""
    return table(
        metadata,
        "voice_files",
        sa.Column(
            "voice_id", sa.String(32), sa.ForeignKey("voices.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )


def features_bytes(features: PromptFeatures) -> bytes:
    """`features` as the bytes of a `.npz` file."""
    buffer = io.BytesIO()
    np.savez(
        buffer,
        speech_feat=features.speech_feat.numpy(),
        speech_token=features.speech_token.numpy(),
        embedding=features.embedding.numpy(),
    )
    return buffer.getvalue()


def save_features(path: Path, features: PromptFeatures) -> None:
    write_atomic(Path(path), features_bytes(features))


def load_features(path: Path) -> PromptFeatures:
    """Features saved by `save_features`: speech_feat `(1, T, 80)`, speech_token `(1, N)`, embedding
    `(1, 192)`."""
    with np.load(path) as data:
        speech_feat = torch.from_numpy(data["speech_feat"])
        return PromptFeatures(
            speech_feat=speech_feat,
            speech_feat_len=torch.tensor([speech_feat.shape[1]], dtype=torch.int32),
            speech_token=torch.from_numpy(data["speech_token"]),
            embedding=torch.from_numpy(data["embedding"]),
        )


def blob_row(voice_id: str, name: str, data: bytes) -> dict[str, Any]:
    """A `voice_files` row."""
    return {
        "voice_id": voice_id,
        "name": name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "data": data,
    }


class VoiceFiles:
    """The blobs in `table` and this node's copies of them under `root/<voice id>/`. Thread-safe."""

    def __init__(self, root: Path, engine: sa.Engine, table: sa.Table) -> None:
        self.root = root
        self.engine = engine
        self.table = table
        self._lock = threading.Lock()
        self._hashes: dict[Path, tuple[tuple[int, int, int], str]] = {}  # local file -> (stat key, sha256)

    def sha256(self, voice_id: str, name: str) -> str | None:
        """The database copy's sha256; None if the database has no such file."""
        return self._blob(voice_id, name, self.table.c.sha256)

    def refresh(self, voice_id: str, name: str, expected: str) -> bool:
        """Make the local copy of a file the database holds with sha256 `expected` current (copied from
        the database if missing or different); False if the database no longer has the file."""
        path = self.root / voice_id / name
        if path.is_file() and self._local_sha256(path) == expected:
            return True
        data = self._blob(voice_id, name, self.table.c.data)
        if data is None:
            return False
        write_atomic(path, bytes(data))  # possibly newer than `expected` (re-analysed meanwhile): fine
        return True

    def shared_ids(self) -> set[str]:
        """Ids of the voices that have files in the database."""
        with self.engine.connect() as conn:
            return set(conn.execute(sa.select(self.table.c.voice_id).distinct()).scalars())

    def put_features(self, conn: sa.Connection, voice_id: str, data: bytes, audio: Path) -> None:
        """Replace a voice's features in the database (inside the caller's transaction `conn`); a voice
        from before shared files has no rows yet: then its local `audio` is shared along with them."""
        row = blob_row(voice_id, FEATURES_FILE, data)
        where = (self.table.c.voice_id == voice_id) & (self.table.c.name == FEATURES_FILE)
        if not conn.execute(self.table.update().where(where).values(**row)).rowcount:
            conn.execute(self.table.insert(), [row, blob_row(voice_id, audio.name, audio.read_bytes())])

    def forget(self, voice_id: str) -> None:
        """Remove this node's copies of a voice's files (the database's are untouched)."""
        with self._lock:
            for path in [p for p in self._hashes if p.parent.name == voice_id]:
                del self._hashes[path]
        shutil.rmtree(self.root / voice_id, ignore_errors=True)

    def _blob(self, voice_id: str, name: str, column: sa.Column) -> Any:
        where = (self.table.c.voice_id == voice_id) & (self.table.c.name == name)
        with self.engine.connect() as conn:
            return conn.execute(sa.select(column).where(where)).scalar_one_or_none()

    def _local_sha256(self, path: Path) -> str:
        """A local file's sha256, hashed again only when its size, mtime or inode changed."""
        stat = path.stat()
        key = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        with self._lock:
            cached = self._hashes.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        with self._lock:
            self._hashes[path] = (key, digest)
        return digest
