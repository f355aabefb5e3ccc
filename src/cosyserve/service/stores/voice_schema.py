"""The `voices` table, and its name rule: a name is unique per owner, not across the server.

Two users may each have a voice called "narrator"; a user learns nothing of other users' names from a
"name taken" answer. Databases made before this rule have a UNIQUE constraint on `name` alone:
`names_unique_per_owner` replaces it with the `voices_owner_name` index on (owner, name), in place on
PostgreSQL and by rebuilding the table on SQLite (which cannot drop a constraint).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.schema import CreateIndex, CreateTable

from cosyserve.service.stores.db import SCHEMA_LOCK_KEY, table

OWNER_NAME_INDEX = "voices_owner_name"


def voices_table(metadata: sa.MetaData) -> sa.Table:
    voices = table(
        metadata,
        "voices",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),  # unique per owner: `voices_owner_name`
        sa.Column("transcript", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("model_checksum", sa.String(64), nullable=False),
        sa.Column("audio_file", sa.String(255), nullable=False),
        sa.Column("defaults", sa.Text, nullable=False, default="{}"),
        sa.Column("lexicon", sa.Text, nullable=False, default="{}"),
        sa.Column("report", sa.Text, nullable=False, default="{}"),
        sa.Column("owner", sa.String(64), nullable=True),
        sa.Column("shared", sa.Boolean, nullable=True),  # None (rows from before it): shared when no owner
        sa.Column("consent", sa.Text, nullable=True),  # JSON: statement, by, at; None: none recorded
    )
    add_owner_name_index(voices)
    return voices


def add_owner_name_index(voices: sa.Table) -> None:
    """Define the (owner, name) unique index on `voices`; no owner counts as one owner of its own."""
    if not any(index.name == OWNER_NAME_INDEX for index in voices.indexes):
        sa.Index(OWNER_NAME_INDEX, sa.func.coalesce(voices.c.owner, ""), voices.c.name, unique=True)


def names_unique_per_owner(engine: sa.Engine, voices: sa.Table) -> None:
    """Drop a global UNIQUE(name) left by an earlier version and make sure the per-owner index exists.
    Safe when several processes start at once."""
    if engine.dialect.name == "sqlite":
        if _sqlite_global_rule(engine, voices.name):
            _rebuild_sqlite(engine, voices)
    elif engine.dialect.name == "postgresql":
        _drop_postgres_rule(engine, voices.name)
    index = next(index for index in voices.indexes if index.name == OWNER_NAME_INDEX)
    with engine.begin() as conn:  # (expression indexes are not reflected: IF NOT EXISTS instead)
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
        conn.execute(CreateIndex(index, if_not_exists=True))


def _sqlite_global_rule(engine: sa.Engine, table_name: str, cursor: Any = None) -> bool:
    """Whether the SQLite table has a UNIQUE constraint on `name` alone (asked on `cursor` when given)."""
    if cursor is None:
        with engine.connect() as conn:
            return _unique_on_name(lambda sql: conn.exec_driver_sql(sql).fetchall(), table_name)
    return _unique_on_name(lambda sql: cursor.execute(sql).fetchall(), table_name)


def _unique_on_name(fetch: Callable[[str], Any], table_name: str) -> bool:
    for _seq, index_name, unique, origin, *_ in fetch(f"PRAGMA index_list('{table_name}')"):
        if unique and origin == "u":
            columns = [row[2] for row in fetch(f"PRAGMA index_info('{index_name}')")]
            if columns == ["name"]:
                return True
    return False


def _rebuild_sqlite(engine: sa.Engine, voices: sa.Table) -> None:
    """Copy the table into one made from today's definition, under one write lock (SQLite's documented
    way to change a constraint). Foreign keys are off meanwhile so `voice_files` rows are left alone."""
    staging = voices.to_metadata(sa.MetaData(), name=f"{voices.name}__rebuild")
    create_sql = str(CreateTable(staging).compile(dialect=engine.dialect))
    raw = engine.raw_connection()
    try:
        dbapi = raw.driver_connection
        isolation = dbapi.isolation_level
        dbapi.isolation_level = None  # statements as written: BEGIN and COMMIT are ours
        cursor = dbapi.cursor()
        cursor.execute("PRAGMA foreign_keys=OFF")
        try:
            cursor.execute("BEGIN IMMEDIATE")
            try:
                if _sqlite_global_rule(engine, voices.name, cursor):  # not done by another process meanwhile
                    present = [row[1] for row in cursor.execute(f"PRAGMA table_info('{voices.name}')")]
                    columns = ", ".join(c.name for c in voices.columns if c.name in present)
                    cursor.execute(f"DROP TABLE IF EXISTS {staging.name}")
                    cursor.execute(create_sql)
                    cursor.execute(
                        f"INSERT INTO {staging.name} ({columns}) SELECT {columns} FROM {voices.name}"
                    )
                    cursor.execute(f"DROP TABLE {voices.name}")
                    cursor.execute(f"ALTER TABLE {staging.name} RENAME TO {voices.name}")
                cursor.execute("COMMIT")
            except BaseException:
                cursor.execute("ROLLBACK")
                raise
        finally:
            cursor.execute("PRAGMA foreign_keys=ON")
            dbapi.isolation_level = isolation
    finally:
        raw.close()


def _drop_postgres_rule(engine: sa.Engine, table_name: str) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
        names = [
            c["name"]
            for c in sa.inspect(conn).get_unique_constraints(table_name)
            if c["column_names"] == ["name"] and c["name"]
        ]
        for name in names:
            conn.execute(sa.text(f'ALTER TABLE {table_name} DROP CONSTRAINT IF EXISTS "{name}"'))
