"""`cosyserve backup DEST`: a consistent copy of a single server's data, taken while it runs.

A plain copy of a running server's data directory (`tar`, `cp -r`) could hold a malformed database: SQLite
in WAL mode keeps recent writes in `cosyserve.db-wal`, and a checkpoint between the copy of that file and
of the database leaves a pair that does not match (a helper's copy of a busy server, 150 MB of outputs
copied in between, failed `PRAGMA integrity_check` twice out of two). This command copies the database
through SQLite's backup API (one consistent snapshot, whatever the server writes meanwhile), checks the
copy, then copies the signing secret and the C2PA key (links and labels made before stay valid) and, with
`--outputs`, the output files (each is written once and renamed into place: a copy of one is complete).

What it leaves out: the voices' folder (the database holds every recording and analysed prompt; a start
writes the files again), the lock file, temporary files. A PostgreSQL database is dumped with `pg_dump`
(docs/deploy.md, "Backups"). Restoring: docs/deploy.md, "Backups".
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cosyserve.errors import InputError, StorageError
from cosyserve.service.stores.job_pieces import FOLDER as PIECES_FOLDER

DATABASE_FILE = "cosyserve.db"
KEY_MATERIAL = ("signing_secret", "c2pa")  # beside the database in the data directory
PROGRESS_EVERY = 500  # output files copied between progress lines
_SKIPPED_OUTPUTS = ("server.lock",)


def add_parser(sub: argparse._SubParsersAction) -> None:
    backup = sub.add_parser(
        "backup",
        help="copy a server's database (consistent while it runs), secrets and optionally its outputs",
        description="Copy the SQLite database through SQLite's backup API (safe while the server runs), "
        "the signing secret and C2PA key, and with --outputs the output files, into DEST (a new or empty "
        "folder). A PostgreSQL database is backed up with pg_dump instead (docs/deploy.md).",
    )
    backup.add_argument("dest", help="folder to write (new, or empty)")
    backup.add_argument("--outputs", action="store_true", help="also copy the output files (may be large)")
    backup.add_argument("--config", default=None, metavar="FILE", help="TOML settings file")
    backup.add_argument("--data-dir", dest="data_dir", default=None, help="the server's data directory")
    backup.add_argument("--database-url", dest="database_url", default=None, help="SQLAlchemy URL")
    backup.add_argument("--output-dir", dest="output_dir", default=None, help="the server's output folder")
    backup.set_defaults(func=cmd_backup, settings_dests=["data_dir", "database_url", "output_dir"])


def cmd_backup(args: argparse.Namespace) -> int:
    from cosyserve.commands.data_dirs import existing_data_dir
    from cosyserve.commands.private_files import keep_files_private
    from cosyserve.commands.serve import load_settings
    from cosyserve.service.stores.db import sqlite_path

    keep_files_private()  # the copy holds what the originals hold
    settings = load_settings(args, args.settings_dests)
    storage = settings.storage
    data_dir = existing_data_dir(storage.data_dir)
    database = sqlite_path(storage.database_url or "")
    if database is None:
        raise InputError(
            "the database is not a SQLite file: back it up with pg_dump (docs/deploy.md, Backups), and "
            "copy the data directory's signing_secret and c2pa/"
        )
    outputs = Path(storage.output_dir)
    if args.outputs and not outputs.is_dir():  # said before anything is written (a retry found DEST taken)
        raise InputError(f"no output folder at {outputs}: check --output-dir")
    dest = _empty_folder(Path(args.dest))
    pages = backup_database(database, dest / DATABASE_FILE, progress=_say_progress("database pages"))
    print(f"database: {database} -> {dest / DATABASE_FILE} ({pages} pages, integrity checked)")
    for name in KEY_MATERIAL:
        source = data_dir / name
        if source.is_dir():
            shutil.copytree(source, dest / name)
        elif source.is_file():
            shutil.copy2(source, dest / name)
    if args.outputs:
        copied = copy_outputs(outputs, dest / "outputs", progress=_say_progress("outputs"))
        print(f"outputs: {copied} files -> {dest / 'outputs'}")
    print(f"backup written to {dest}")
    return 0


def backup_database(source: Path, target: Path, progress: Callable[[int, int], Any] | None = None) -> int:
    """A consistent copy of the SQLite database `source` at `target` (its pages, as of one moment of the
    writes of every other connection); StorageError when the copy does not pass SQLite's integrity check.
    Returns the pages copied."""
    if not source.is_file():
        raise InputError(f"no database at {source}: check --data-dir (or --database-url)")
    reader = sqlite3.connect(source, timeout=30)
    writer = sqlite3.connect(target)
    try:

        def told(status: int, remaining: int, total: int) -> None:
            if progress is not None:
                progress(total - remaining, total)

        reader.backup(writer, pages=0, progress=told)  # (0: every page in one step, one snapshot)
        checked = writer.execute("PRAGMA integrity_check").fetchall()
        pages = int(writer.execute("PRAGMA page_count").fetchone()[0])
    finally:
        writer.close()
        reader.close()
    if checked != [("ok",)]:
        raise StorageError(f"the copy of {source} did not pass SQLite's integrity check: {checked[:3]}")
    return pages


def copy_outputs(source: Path, target: Path, progress: Callable[[int, int], Any] | None = None) -> int:
    """Every finished output file of `source` (audio, sidecar, subtitles, tombstones) into `target`, and
    the pieces long texts kept (a restored running job goes on from them); returns how many output files
    were copied. Temporary files of saves in progress are left out."""
    if not source.is_dir():
        raise InputError(f"no output folder at {source}: check --output-dir")
    names = sorted(p.name for p in source.iterdir() if p.is_file() and _is_output_file(p.name))
    target.mkdir(parents=True, exist_ok=True)
    copied = 0
    for name in names:
        try:
            shutil.copy2(source / name, target / name)
        except FileNotFoundError:  # removed by retention (or a user) since it was listed
            continue
        copied += 1
        if progress is not None and copied % PROGRESS_EVERY == 0:
            progress(copied, len(names))
    pieces = source / PIECES_FOLDER
    if pieces.is_dir():
        with contextlib.suppress(shutil.Error):  # a job ended while its pieces were copied: they went with it
            shutil.copytree(pieces, target / PIECES_FOLDER, dirs_exist_ok=True)
    return copied


def _is_output_file(name: str) -> bool:
    return name not in _SKIPPED_OUTPUTS and not name.startswith(".")


def _empty_folder(dest: Path) -> Path:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InputError(f"{dest} exists and is not an empty folder: name a new one")
    dest.mkdir(parents=True, exist_ok=True)
    return dest


def _say_progress(what: str) -> Callable[[int, int], None]:
    def say(done: int, total: int) -> None:
        print(f"  {what}: {done} of {total}", file=sys.stderr, flush=True)

    return say
