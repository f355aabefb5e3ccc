"""The voice library: prompts enrolled once, synthesised from many times without re-analysis.

A voice is a row in the `voices` table (name, transcript, defaults, lexicon, prompt report) plus a
folder `<root>/<voice id>/` with the original recording and `features.npz` (speaker embedding,
prompt speech tokens, prompt mel). Features are tied to the model they were computed with: a voice
enrolled with another model is re-analysed from its original recording on first use.
"""

from __future__ import annotations

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

import numpy as np
import sqlalchemy as sa
import torch

from cosyserve.errors import InputError
from cosyserve.frontend.prompt_features import PromptFeatures

NAME_PATTERN = re.compile(r"^[\w\-. \u3000-\u9fff]{1,64}$")
MAX_TRANSCRIPT_CHARS = 500


class VoiceNotFound(InputError):
    """No voice with that id or name."""


@dataclass(frozen=True)
class VoiceDefaults:
    """Per-voice defaults, used when a request does not set the field."""

    instruct: str | None = None
    speed: float | None = None
    seed: int | None = None


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

    def public(self) -> dict[str, Any]:
        """What the API shows (no file paths)."""
        return {
            "id": self.id,
            "name": self.name,
            "transcript": self.transcript,
            "created_at": self.created_at,
            "defaults": self.defaults.__dict__,
            "lexicon": self.lexicon,
            "report": self.report,
        }


def voices_table(metadata: sa.MetaData) -> sa.Table:
    if "voices" in metadata.tables:
        return metadata.tables["voices"]
    return sa.Table(
        "voices",
        metadata,
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("transcript", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("model_checksum", sa.String(64), nullable=False),
        sa.Column("audio_file", sa.String(255), nullable=False),
        sa.Column("defaults", sa.Text, nullable=False, default="{}"),
        sa.Column("lexicon", sa.Text, nullable=False, default="{}"),
        sa.Column("report", sa.Text, nullable=False, default="{}"),
    )


def save_features(path: Path, features: PromptFeatures) -> None:
    tmp = path.with_suffix(".tmp.npz")
    np.savez(
        tmp,
        speech_feat=features.speech_feat.numpy(),
        speech_token=features.speech_token.numpy(),
        embedding=features.embedding.numpy(),
    )
    tmp.replace(path)


def load_features(path: Path) -> PromptFeatures:
    with np.load(path) as data:
        speech_feat = torch.from_numpy(data["speech_feat"])
        return PromptFeatures(
            speech_feat=speech_feat,
            speech_feat_len=torch.tensor([speech_feat.shape[1]], dtype=torch.int32),
            speech_token=torch.from_numpy(data["speech_token"]),
            embedding=torch.from_numpy(data["embedding"]),
        )


Analyser = Callable[[bytes], PromptFeatures]


class VoiceLibrary:
    """Persistent voices: SQL rows (SQLite by default) + files under `root`. Thread-safe."""

    def __init__(self, root: Path, engine: sa.Engine, metadata: sa.MetaData, *, model_checksum: str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.engine = engine
        self.table = voices_table(metadata)
        self.table.create(engine, checkfirst=True)
        self.model_checksum = model_checksum
        self._lock = threading.Lock()
        self._features: dict[str, PromptFeatures] = {}  # in-memory cache by voice id

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
    ) -> Voice:
        """Analyse `audio` once and store everything; InputError for a bad name, duplicate or prompt."""
        name = _check_name(name)
        transcript = _check_transcript(transcript)
        if self._find(name) is not None:
            raise InputError(f"a voice named {name!r} already exists: pick another name or delete it first")
        features = analyse(audio)  # raises InputError for unusable audio, before anything is written
        voice_id = uuid.uuid4().hex
        folder = self.root / voice_id
        folder.mkdir(parents=True)
        try:
            audio_file = "prompt" + (
                audio_suffix if re.fullmatch(r"\.[a-z0-9]{1,5}", audio_suffix) else ".bin"
            )
            (folder / audio_file).write_bytes(audio)
            save_features(folder / "features.npz", features)
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
                        lexicon=json.dumps(lexicon or {}, ensure_ascii=False),
                        report=json.dumps(report, ensure_ascii=False),
                    )
                )
        except sa.exc.IntegrityError as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise InputError(f"a voice named {name!r} already exists: pick another name") from exc
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        with self._lock:
            self._features[voice_id] = features
        return self.get(voice_id)

    # ---- lookup ---------------------------------------------------------------------------------
    def get(self, id_or_name: str) -> Voice:
        row = self._find(id_or_name)
        if row is None:
            raise VoiceNotFound(
                f"no voice {id_or_name!r}: list voices with GET /v1/voices or `cosyserve voices list`"
            )
        return self._to_voice(row)

    def list(self) -> list[Voice]:
        with self.engine.connect() as conn:
            rows = conn.execute(self.table.select().order_by(self.table.c.created_at)).mappings().all()
        return [self._to_voice(row) for row in rows]

    def features(self, voice: Voice, analyse: Analyser | None = None) -> PromptFeatures:
        """The voice's prompt features, from memory, disk, or (other model) re-analysed from its audio."""
        with self._lock:
            cached = self._features.get(voice.id)
        if cached is not None:
            return cached
        if voice.model_checksum != self.model_checksum and analyse is not None:
            features = analyse(voice.audio_path.read_bytes())
            save_features(voice.features_path, features)
            with self.engine.begin() as conn:
                conn.execute(
                    self.table.update()
                    .where(self.table.c.id == voice.id)
                    .values(model_checksum=self.model_checksum)
                )
        else:
            features = load_features(voice.features_path)
        with self._lock:
            self._features[voice.id] = features
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
    ) -> Voice:
        voice = self.get(id_or_name)
        values: dict[str, Any] = {}
        if name is not None and name != voice.name:
            name = _check_name(name)
            if self._find(name) is not None:
                raise InputError(f"a voice named {name!r} already exists: pick another name")
            values["name"] = name
        if transcript is not None:
            values["transcript"] = _check_transcript(transcript)
        if defaults is not None:
            values["defaults"] = json.dumps(defaults.__dict__)
        if lexicon is not None:
            values["lexicon"] = json.dumps(lexicon, ensure_ascii=False)
        if values:
            with self.engine.begin() as conn:
                conn.execute(self.table.update().where(self.table.c.id == voice.id).values(**values))
        return self.get(voice.id)

    def delete(self, id_or_name: str) -> None:
        voice = self.get(id_or_name)
        with self.engine.begin() as conn:
            conn.execute(self.table.delete().where(self.table.c.id == voice.id))
        with self._lock:
            self._features.pop(voice.id, None)
        shutil.rmtree(self.root / voice.id, ignore_errors=True)

    # ---- internals ------------------------------------------------------------------------------
    def _find(self, id_or_name: str) -> Any:
        with self.engine.connect() as conn:
            query = self.table.select().where(
                sa.or_(self.table.c.id == id_or_name, self.table.c.name == id_or_name)
            )
            return conn.execute(query).mappings().first()

    def _to_voice(self, row: Any) -> Voice:
        folder = self.root / row["id"]
        return Voice(
            id=row["id"],
            name=row["name"],
            transcript=row["transcript"],
            created_at=row["created_at"],
            model_checksum=row["model_checksum"],
            audio_path=folder / row["audio_file"],
            features_path=folder / "features.npz",
            defaults=VoiceDefaults(**json.loads(row["defaults"] or "{}")),
            lexicon=json.loads(row["lexicon"] or "{}"),
            report=json.loads(row["report"] or "{}"),
        )


def _check_name(name: str) -> str:
    name = (name or "").strip()
    if not NAME_PATTERN.fullmatch(name):
        raise InputError(
            "a voice name must be 1-64 letters, digits, spaces, '-', '_', '.' or Chinese characters"
        )
    return name


def _check_transcript(transcript: str | None) -> str | None:
    if transcript is None or not transcript.strip():
        return None
    transcript = transcript.strip()
    if len(transcript) > MAX_TRANSCRIPT_CHARS:
        raise InputError(f"the transcript is {len(transcript)} characters; at most {MAX_TRANSCRIPT_CHARS}")
    return transcript
