"""`cosyserve keys create|list|revoke|rotate`: API key administration from the command line.

The CLI wires it in with `add_keys_parser(subparsers, get_store)`, where `get_store(args)` opens the
KeyStore of the configured database (so this module knows nothing about settings).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from cosyserve.service.stores.keys import ROLES, ApiKey, KeyNotFound, KeyStore

COLUMNS = ("id", "name", "prefix", "role", "created", "last used", "rate/min", "quota s/day", "status")


def add_keys_parser(
    subparsers: argparse._SubParsersAction, get_store: Callable[[argparse.Namespace], KeyStore]
) -> argparse.ArgumentParser:
    """Add `keys` with its subcommands; returns the `keys` parser (to add e.g. --data-dir to it)."""
    keys = subparsers.add_parser("keys", help="create, list and revoke API keys")
    actions = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")

    create = actions.add_parser("create", help="create a key and print it (the only time it is shown)")
    create.add_argument("name", help="who or what the key is for, e.g. 'web-frontend'")
    create.add_argument("--role", choices=ROLES, default="user", help="admin keys may manage keys and voices")
    create.add_argument(
        "--rate-limit",
        type=int,
        default=None,
        metavar="N",
        help="requests per minute for this key (default: the server's; 0: unlimited)",
    )
    create.add_argument(
        "--quota",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds of audio per UTC day (default: the server's)",
    )
    create.add_argument("--quiet", action="store_true", help="print only the key (for scripts)")

    listing = actions.add_parser("list", help="list keys (prefixes only; keys themselves are not stored)")
    listing.add_argument("--active", action="store_true", help="leave out revoked keys")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")

    revoke = actions.add_parser("revoke", help="revoke a key by id, prefix or name; it stops working at once")
    revoke.add_argument(
        "key", help="numeric id, prefix (cs_xxxxxxxx) or the name of one active key, as `keys list` shows"
    )

    rotate = actions.add_parser(
        "rotate",
        help="give a key a new secret on the same id (its voices, outputs, jobs and usage stay its own); "
        "the old one stops working at once",
    )
    rotate.add_argument("key", help="numeric id, prefix (cs_xxxxxxxx) or the name of one active key")
    rotate.add_argument("--quiet", action="store_true", help="print only the new key (for scripts)")

    def run(args: argparse.Namespace) -> int:
        return run_keys_command(args, get_store(args))

    keys.set_defaults(func=run)
    return keys


def run_keys_command(args: argparse.Namespace, store: KeyStore, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if args.keys_command == "create":
        record, plaintext = store.create(args.name, args.role, rate_limit=args.rate_limit, quota=args.quota)
        if args.quiet:
            print(plaintext, file=out)
            return 0
        print(format_table([record]), file=out)
        print(f"\nAPI key (shown only now; store it somewhere safe):\n{plaintext}", file=out)
        return 0
    if args.keys_command == "list":
        records = store.list(include_revoked=not args.active)
        if args.json:
            print(json.dumps([r.public() for r in records], indent=2), file=out)
        else:
            print(
                format_table(records) if records else "no API keys; create one with `cosyserve keys create`",
                file=out,
            )
        return 0
    if args.keys_command == "revoke":
        revoked_before = {key.id for key in store.list(include_revoked=True) if not key.active}
        record = store.revoke(_id_or_prefix(store, args.key))  # revoking twice keeps the first: say so
        earlier = record.id in revoked_before
        done = f"was already revoked ({_when(record.revoked_at)})" if earlier else "revoked"
        print(f"key {record.id} ({record.name}, {record.prefix}) {done}", file=out)
        return 0
    if args.keys_command == "rotate":
        record, plaintext = store.rotate(_id_or_prefix(store, args.key, "rotate"))
        if args.quiet:
            print(plaintext, file=out)
            return 0
        print(f"key {record.id} ({record.name}) has a new secret; the old one no longer works", file=out)
        print(f"\nAPI key (shown only now; store it somewhere safe):\n{plaintext}", file=out)
        return 0
    raise AssertionError(f"unhandled keys command {args.keys_command!r}")  # argparse restricts the choices


def _id_or_prefix(store: KeyStore, key: str, action: str = "revoke") -> str:
    """`key` as `KeyStore.revoke` and `rotate` take it: an id or a prefix as given, a name as its one
    active key's id (KeyNotFound naming the keys when several active keys have that name)."""
    if store.is_id_or_prefix(key):
        return key
    named = [record for record in store.list(include_revoked=False) if record.name == key.strip()]
    if len(named) > 1:
        ids = ", ".join(f"{record.id} ({record.prefix})" for record in named)
        raise KeyNotFound(
            f"{len(named)} active keys are named {key.strip()!r}: {ids}; {action} one by its id"
        )
    if not named:
        raise KeyNotFound(
            f"{key!r} is no key id, no key prefix like cs_Ab3dEf9h and no active key's name; "
            "`cosyserve keys list` shows them"
        )
    return str(named[0].id)


def format_table(records: Sequence[ApiKey]) -> str:
    rows = [COLUMNS] + [_row(record) for record in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _row(record: ApiKey) -> tuple[str, ...]:
    return (
        str(record.id),
        record.name,
        record.prefix,
        record.role,
        _when(record.created_at),
        _when(record.last_used_at),
        "default"
        if record.rate_limit_per_minute is None
        else str(record.rate_limit_per_minute or "unlimited"),
        "default" if record.daily_audio_seconds_quota is None else f"{record.daily_audio_seconds_quota:g}",
        "active" if record.active else f"revoked {_when(record.revoked_at)}",
    )


def _when(timestamp: float | None) -> str:
    return "-" if timestamp is None else time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(timestamp))
