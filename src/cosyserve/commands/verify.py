"""`cosyserve verify FILE…`: are an output's AI labels intact? (docs/labels.md)

Reads each file's implicit label (the GB 45438 `AIGC` metadata field) and its C2PA manifest, checks the
label's audio hash and the server's signature (the signing secret from the settings or `<data_dir>`;
without one only the hash is checked), and prints the verdict. Exit status: 0 every file intact,
1 altered, 2 unlabelled, 3 unbound (a streamed file), for the worst file (altered, then unlabelled,
then unbound). A file that can't be read at all also exits 2, with an error message.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cosyserve.errors import InputError

SEVERITY = ("intact", "unbound", "unlabelled", "altered")  # which file's verdict the exit status gives


def add_parser(sub: argparse._SubParsersAction) -> None:
    verify = sub.add_parser(
        "verify",
        help="check the AI labels (implicit label, C2PA manifest) of audio files",
        description="Exit status: 0 intact, 1 altered, 2 unlabelled, 3 unbound (a stream's label).",
    )
    verify.add_argument("files", nargs="+", metavar="FILE", help="wav, mp3, flac or opus files")
    verify.add_argument("--json", action="store_true", help="print one JSON report per file")
    verify.add_argument("--config", default=None, metavar="FILE", help="TOML settings file")
    verify.add_argument("--data-dir", dest="data_dir", default=None, help="where the signing secret lives")
    verify.add_argument("--no-c2pa", action="store_true", help="skip reading the C2PA manifest")
    verify.set_defaults(func=cmd_verify, settings_dests=["data_dir"])


def signing_secret(settings: Any) -> bytes | None:
    """The server's signing secret if it is configured or kept in data_dir; never creates one."""
    from cosyserve.service.settings import SIGNING_SECRET_FILE

    if settings.auth.signing_secret is not None:
        return settings.auth.signing_secret.get_secret_value().encode("utf-8")
    path = settings.storage.data_dir / SIGNING_SECRET_FILE
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return value.encode("utf-8") if value else None


def cmd_verify(args: argparse.Namespace) -> int:
    from cosyserve.commands.serve import load_settings
    from cosyserve.service.labels.verify import EXIT_CODES, verify

    secret = signing_secret(load_settings(args, args.settings_dests))
    worst = "intact"
    for name in args.files:
        try:
            data = Path(name).read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read {name}: {exc.strerror or exc}") from exc
        report = verify(data, secret, check_c2pa=not args.no_c2pa)
        worst = max(worst, report.status, key=SEVERITY.index)
        if args.json:
            print(json.dumps({"file": name, **report.to_dict()}, ensure_ascii=False))
        else:
            print(describe(name, report))
    if secret is None and not args.json:
        print(
            "note: no signing secret found (set signing_secret or --data-dir): signatures unchecked",
            file=sys.stderr,
        )
    return EXIT_CODES[worst]


def describe(name: str, report: Any) -> str:
    lines = [f"{name}: {report.status} ({report.format or 'unknown format'})"]
    if report.label:
        label = report.label
        lines.append(
            f"  label: Label={label.get('Label')} ContentProducer={label.get('ContentProducer')} "
            f"ProduceID={label.get('ProduceID')} signature={report.signature}"
        )
    lines += [f"  problem: {problem}" for problem in report.problems]
    c2pa = report.c2pa or {}
    if c2pa:
        detail = c2pa.get("detail") or ""
        if c2pa.get("status") in ("valid", "invalid"):
            trusted = "trusted signer" if c2pa.get("trusted_signer") else "untrusted signer (self-signed?)"
            detail = (
                f"AI-generated={c2pa.get('ai_generated')}, {trusted}, generation={c2pa.get('generation')}"
            )
        lines.append(f"  c2pa: {c2pa.get('status')} {detail}".rstrip())
    return "\n".join(lines)
