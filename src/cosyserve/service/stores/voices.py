"""The voice library: prompts enrolled once, synthesised from many times without re-analysis.

A voice is a row in the `voices` table (name, transcript, defaults, lexicon, prompt report) plus two files:
the original recording and `features.npz` (speaker embedding, prompt speech tokens, prompt mel). Features
are tied to the model they were computed with: a voice enrolled with another model is re-analysed from
its original recording on first use.

Several nodes share one database but not a filesystem, so the files live in the database too
(`voice_files`), and `<root>/<voice id>/` is each node's local copy of them: `audio_file`/`features_file`
bring it up to date before it is used. Lookups always ask the database, so a voice deleted on one node
is gone on every node; a stale local copy is removed lazily (`get` of that id, `prune_local`). Voices
enrolled before files were shared have no `voice_files` rows: they work on the node that holds their
files, and `share_local_files` there copies them into the database for the others.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from cosyserve.errors import StorageError
from cosyserve.errors import VoiceFilesMissing as VoiceFilesMissing
from cosyserve.errors import VoiceInUse as VoiceInUse
from cosyserve.errors import VoiceNotFound as VoiceNotFound  # defined there, with the error table
from cosyserve.errors import VoiceUnavailable as VoiceUnavailable
from cosyserve.frontend.prompt_features import PromptFeatures
from cosyserve.service.requests import EVERY_VOICE, VoiceDefaults, VoiceScope
from cosyserve.service.stores.atomic_files import write_atomic
from cosyserve.service.stores.db import add_missing_columns, create_tables
from cosyserve.service.stores.voice_fields import (
    AmbiguousVoice,  # noqa: F401  (re-exported: the stores' callers catch it with the others)
    check_name,
    check_room,
    check_transcript,
    lexicon_json,
    name_taken,
    pick_row,
    same_spelling,
    shared_of,
    stored_defaults,
    stored_json,
)
from cosyserve.service.stores.voice_files import (
    FEATURES_FILE,
    VoiceFiles,
    blob_row,
    features_bytes,
    load_features,
    save_features,  # noqa: F401  (re-exported, as is voice_files_table)
    voice_files_table,
)
from cosyserve.service.stores.voice_schema import names_unique_per_owner, voices_table

VOICE_ID = re.compile(r"[0-9a-f]{32}")
ORPHAN_GRACE_S = 3600.0  # a local folder without a voice row, younger than this, may be an enrolment


@dataclass(frozen=True)
class Voice:
    id: str
    name: str
    transcript: str | None
    created_at: float
    model_checksum: str
    audio_path: Path
    features_path: Path
    defaults: VoiceDefaults = field(default_factory=VoiceDefaults)
    lexicon: dict[str, str] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)
    owner: str | None = None  # who enrolled it (`key:<id>`, `user:<name>`); None: nobody (auth off, or old)
    shared: bool = True  # every caller may use it; otherwise only its owner and admins
    consent: dict[str, Any] | None = None  # what the enroller confirmed, by whom and when (voice_rules)

    def public(self, *, private: bool = True) -> dict[str, Any]:
        """What the API shows (no file paths); without `private`, no transcript (the recording's words are
        its owner's, like the recording itself)."""
        return {
            "id": self.id,
            "name": self.name,
            "transcript": self.transcript if private else None,
            "created_at": self.created_at,
            "defaults": self.defaults.__dict__,
            "lexicon": self.lexicon,
            "report": self.report,
            "shared": self.shared,
            "owner": self.owner if private else None,
            "enrolled_by": (self.consent or {}).get("by") if private else None,
            "consent": self.consent if private else None,
        }


Analyser = Callable[[bytes], PromptFeatures]


class VoiceLibrary:
    """Persistent voices: SQL rows and file blobs (SQLite by default), local copies under `root`.
    Thread-safe; several processes and nodes may share the database."""

    def __init__(self, root: Path, engine: sa.Engine, metadata: sa.MetaData, *, model_checksum: str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.engine = engine
        self.table = voices_table(metadata)
        self.files = voice_files_table(metadata)  # after `voices`: its foreign key names that table
        create_tables(engine, self.table, self.files)  # databases from before shared files get `files` here
        add_missing_columns(engine, self.table)  # and those from before owners get `owner` and `shared`
        names_unique_per_owner(engine, self.table)  # and those with globally unique names lose that rule
        self.blobs = VoiceFiles(self.root, engine, self.files)
        self.model_checksum = model_checksum
        # the most voices one owner keeps (None: no limit): each holds its recording in the database and
        # on disk, which no retention frees, so one user could fill the disk everyone shares
        self.max_per_owner: int | None = None
        self._lock = threading.Lock()
        # by voice id: (the model checksum they were computed for, features)
        self._features: dict[str, tuple[str, PromptFeatures]] = {}

    # ---- enrolment ------------------------------------------------------------------------------
    def add(
        self,
        name: str,
        audio: bytes,
        analyse: Analyser,
        *,
        transcript: str | None = None,
        audio_suffix: str = ".wav",
        defaults: VoiceDefaults | None = None,
        lexicon: dict[str, str] | None = None,
        owner: str | None = None,
        shared: bool | None = None,
        consent: dict[str, Any] | None = None,
    ) -> Voice:
        """Analyse `audio` once and store everything; InputError for a bad name, duplicate or prompt.
        `owner`: who enrols it (a principal's owner string); `shared`: every caller may use it (default:
        only a voice nobody owns, e.g. from the CLI on the server or with auth off)."""
        name = check_name(name)
        transcript = check_transcript(transcript)
        lexicon_text = lexicon_json(lexicon or {})
        if self._named(name, owner) is not None:
            raise name_taken(name)
        check_room(self.engine, self.table, owner, self.max_per_owner)
        features = analyse(audio)  # raises InputError for unusable audio, before anything is written
        voice_id = uuid.uuid4().hex
        folder = self.root / voice_id
        audio_file = "prompt" + (audio_suffix if re.fullmatch(r"\.[a-z0-9]{1,5}", audio_suffix) else ".bin")
        blobs = {audio_file: bytes(audio), FEATURES_FILE: features_bytes(features)}
        try:
            folder.mkdir(parents=True)
            for file_name, data in blobs.items():
                write_atomic(folder / file_name, data)
            report = features.report.as_dict() if features.report is not None else {}
            with self.engine.begin() as conn:
                conn.execute(
                    self.table.insert().values(
                        id=voice_id,
                        name=name,
                        transcript=transcript,
                        created_at=time.time(),
                        model_checksum=self.model_checksum,
                        audio_file=audio_file,
                        defaults=json.dumps((defaults or VoiceDefaults()).__dict__),
                        lexicon=lexicon_text,
                        report=json.dumps(report, ensure_ascii=False),
                        owner=owner,
                        shared=owner is None if shared is None else bool(shared),
                        consent=json.dumps(consent, ensure_ascii=False) if consent else None,
                    )
                )
                conn.execute(self.files.insert(), [blob_row(voice_id, n, d) for n, d in blobs.items()])
        except sa.exc.IntegrityError as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise name_taken(name) from exc
        except (OSError, sa.exc.OperationalError) as exc:  # a full or read-only disk: 503, not a 500
            shutil.rmtree(folder, ignore_errors=True)
            raise StorageError(
                f"the voice could not be saved ({getattr(exc, 'strerror', None) or exc}): make room in "
                f"{self.root.parent}, then enrol it again"
            ) from exc
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        with self._lock:
            self._features[voice_id] = (self.model_checksum, features)
        return self.get(voice_id)

    # ---- lookup ---------------------------------------------------------------------------------
    def get(self, id_or_name: str, scope: VoiceScope = EVERY_VOICE) -> Voice:
        """The voice of that id or name; VoiceNotFound if there is none, or none `scope` may use (the
        same answer: a caller can't tell another user's voice from a missing one). A name several usable
        voices share means the caller's own, else the one shared voice; AmbiguousVoice otherwise."""
        id_or_name = same_spelling(id_or_name)
        rows = self._matching(id_or_name)
        if not rows:
            self._forget(id_or_name)  # deleted on another node: drop what this node still holds
        row = pick_row(id_or_name, [r for r in rows if scope.includes(r["owner"], shared_of(r))], scope)
        if row is None:
            raise VoiceNotFound(
                f"no voice {id_or_name!r}: list voices with GET /v1/voices or `cosyserve voices list`"
            )
        return self._to_voice(row)

    def list(self, scope: VoiceScope = EVERY_VOICE) -> list[Voice]:
        """The voices `scope` may use, oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(self.table.select().order_by(self.table.c.created_at)).mappings().all()
        return [self._to_voice(row) for row in rows if scope.includes(row["owner"], shared_of(row))]

    def audio_file(self, voice: Voice) -> Path:
        """The voice's original recording on this node's disk (copied from the database when missing or
        stale). Use this, not `voice.audio_path`, which may not exist on this node."""
        return self._local_file(voice, voice.audio_path.name)

    def features_file(self, voice: Voice) -> Path:
        """The voice's `features.npz` on this node's disk (copied from the database when needed)."""
        return self._local_file(voice, FEATURES_FILE)

    def ensure_local(self, voice: Voice) -> Voice:
        """Bring both of the voice's local files up to date; returns `voice` (its paths then exist)."""
        self.audio_file(voice)
        self.features_file(voice)
        return voice

    def features(self, voice: Voice, analyse: Analyser | None = None) -> PromptFeatures:
        """The voice's prompt features, from memory, disk, or (other model) re-analysed from its audio."""
        reanalyse = voice.model_checksum != self.model_checksum and analyse is not None
        wanted = self.model_checksum if reanalyse else voice.model_checksum
        with self._lock:
            cached = self._features.get(voice.id)
        if cached is not None and cached[0] == wanted:
            return cached[1]
        if reanalyse:
            assert analyse is not None
            features = analyse(self.audio_file(voice).read_bytes())
            self._store_features(voice, features)
        else:
            features = load_features(self.features_file(voice))
        with self._lock:
            self._features[voice.id] = (wanted, features)
        return features

    # ---- changes --------------------------------------------------------------------------------
    def update(
        self,
        id_or_name: str,
        *,
        name: str | None = None,
        transcript: str | None = None,
        defaults: VoiceDefaults | None = None,
        lexicon: dict[str, str] | None = None,
        shared: bool | None = None,
        scope: VoiceScope = EVERY_VOICE,
    ) -> Voice:
        """Change the fields given (None: keep); the name stays unique among the owner's voices."""
        voice = self.get(id_or_name, scope)
        values: dict[str, Any] = {}
        if name is not None and name != voice.name:
            name = check_name(name)
            if self._named(name, voice.owner) is not None:
                raise name_taken(name)
            values["name"] = name
        if shared is not None:
            values["shared"] = bool(shared)
        if transcript is not None:
            values["transcript"] = check_transcript(transcript)
        if defaults is not None:
            values["defaults"] = json.dumps(defaults.__dict__)
        if lexicon is not None:
            values["lexicon"] = lexicon_json(lexicon)
        if values:
            try:
                with self.engine.begin() as conn:
                    conn.execute(self.table.update().where(self.table.c.id == voice.id).values(**values))
            except sa.exc.IntegrityError as exc:  # the same name taken on another node meanwhile
                raise name_taken(name or voice.name) from exc
        return self.get(voice.id)

    def delete(self, id_or_name: str) -> None:
        voice = self.get(id_or_name)
        with self.engine.begin() as conn:  # explicitly: SQLite enforces the cascade only when told to
            conn.execute(self.files.delete().where(self.files.c.voice_id == voice.id))
            conn.execute(self.table.delete().where(self.table.c.id == voice.id))
        self._forget(voice.id)

    def share_local_files(self) -> int:
        """Copy into the database the local files of voices that have none there yet (enrolled before
        files were shared), so other nodes can use them; returns how many voices were shared."""
        shared = self.blobs.shared_ids()
        count = 0
        for voice in self.list():
            paths = [voice.audio_path, voice.features_path]
            if voice.id in shared or not all(path.is_file() for path in paths):
                continue
            rows = [blob_row(voice.id, path.name, path.read_bytes()) for path in paths]
            try:
                with self.engine.begin() as conn:
                    if conn.execute(sa.select(self.table.c.id).where(self.table.c.id == voice.id)).first():
                        conn.execute(self.files.insert(), rows)
                        count += 1
            except sa.exc.IntegrityError:
                continue  # another process shared it at the same time
        return count

    def prune_local(self, grace_s: float = ORPHAN_GRACE_S) -> list[str]:
        """Remove local copies of voices that no longer exist (deleted on another node); returns their ids.
        Folders younger than `grace_s` are kept: they may belong to an enrolment still in progress."""
        with self.engine.connect() as conn:
            known = set(conn.execute(sa.select(self.table.c.id)).scalars())
        removed = []
        now = time.time()
        for folder in self.root.iterdir():
            if not (VOICE_ID.fullmatch(folder.name) and folder.is_dir()) or folder.name in known:
                continue
            with contextlib.suppress(FileNotFoundError):
                if now - folder.stat().st_mtime > grace_s:
                    self._forget(folder.name)
                    removed.append(folder.name)
        return removed

    # ---- internals ------------------------------------------------------------------------------
    def _matching(self, id_or_name: str) -> list[Any]:
        """The rows whose id or name is `id_or_name` (several owners may use one name)."""
        if not isinstance(id_or_name, str) or "\x00" in id_or_name:  # PostgreSQL refuses NUL in text
            return []
        with self.engine.connect() as conn:
            query = self.table.select().where(
                sa.or_(self.table.c.id == id_or_name, self.table.c.name == id_or_name)
            )
            return list(conn.execute(query).mappings().all())

    def _find(self, voice_id: str) -> Any:
        """The row of that id, or None."""
        return next((row for row in self._matching(voice_id) if row["id"] == voice_id), None)

    def _named(self, name: str, owner: str | None) -> Any:
        """The row of `owner`'s voice called `name`, or None."""
        return next((r for r in self._matching(name) if r["name"] == name and r["owner"] == owner), None)

    def _to_voice(self, row: Any) -> Voice:
        folder = self.root / row["id"]
        return Voice(
            id=row["id"],
            name=row["name"],
            transcript=row["transcript"],
            created_at=row["created_at"],
            model_checksum=row["model_checksum"],
            audio_path=folder / row["audio_file"],
            features_path=folder / FEATURES_FILE,
            defaults=stored_defaults(row),
            lexicon=stored_json(row, "lexicon", {}),
            report=stored_json(row, "report", {}),
            owner=row["owner"],
            shared=shared_of(row),
            consent=stored_json(row, "consent", None),
        )

    def _forget(self, voice_id: str) -> None:
        """Drop the cached features and local copy of a voice that is gone (only well-formed ids)."""
        if not VOICE_ID.fullmatch(voice_id or ""):
            return
        with self._lock:
            self._features.pop(voice_id, None)
        self.blobs.forget(voice_id)

    def _local_file(self, voice: Voice, name: str) -> Path:
        path = self.root / voice.id / name
        expected = self.blobs.sha256(voice.id, name)
        if expected is None:  # deleted meanwhile, or enrolled before files were shared: local only
            if path.is_file() and self._find(voice.id) is not None:
                return path
            self.get(voice.id)  # VoiceNotFound if it is gone
            raise VoiceFilesMissing(
                f"voice {voice.name!r} was enrolled before voices were shared between nodes and its files "
                "are only on the node that enrolled it: share them from there (`share_local_files`) "
                "or enrol the voice again"
            )
        if not self.blobs.refresh(voice.id, name, expected):
            self.get(voice.id)
            raise VoiceNotFound(f"voice {voice.name!r} was changed while it was read: try again")
        return path

    def _store_features(self, voice: Voice, features: PromptFeatures) -> None:
        """Replace the voice's features (re-analysed for this node's model): database first, then disk."""
        data = features_bytes(features)
        with self.engine.begin() as conn:
            voice_row = self.table.update().where(self.table.c.id == voice.id)
            if not conn.execute(voice_row.values(model_checksum=self.model_checksum)).rowcount:
                raise VoiceNotFound(f"voice {voice.name!r} was deleted while it was analysed")
            self.blobs.put_features(conn, voice.id, data, voice.audio_path)
        write_atomic(voice.features_path, data)
