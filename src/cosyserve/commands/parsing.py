"""The argument parser of every `cosyserve` command: usage errors in one line that says what to do.

argparse prints the whole usage block and then the error; a new user reads the usage and misses the
error. Here an error is one line on stderr (`cosyserve synthesize: error: …; see --help`) with exit
status 2, and a text that starts with `-` (`-5度`, taken for a flag) gets a hint to write `--text=-5度`
or to put it after `--`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import NoReturn
from urllib.parse import urlsplit

from cosyserve.exit_codes import ExitCode


def looks_like_text(token: str) -> bool:
    """A dash-led token that is no flag's spelling: a negative number, CJK text, words with spaces."""
    if not token.startswith("-") or token == "--" or len(token) < 2:
        return False
    rest = token.lstrip("-")
    if not rest:
        return False
    first = rest[0]
    return not (first.isascii() and first.isalpha()) or any(not c.isascii() or c.isspace() for c in rest)


class CliParser(argparse.ArgumentParser):
    """argparse with one-line errors; subcommand parsers are made of this class too."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._seen_args = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def dash_text_hint(self, message: str) -> str:
        """For a text taken for a flag: how to pass it; "" when the error has another cause."""
        flag = re.match(r"argument (--[\w-]+)(?:/[^:]*)?: expected one argument", message)
        for token in getattr(self, "_seen_args", []):
            if token == "--":
                break
            if token.split("=", 1)[0] in self._option_string_actions or not looks_like_text(token):
                continue
            if flag is not None:
                return f"; {token} starts with '-', so it was read as a flag: write {flag.group(1)}={token}"
            if token in message:
                return (
                    f"; {token} starts with '-', so it was read as a flag: to pass it as a text, put it "
                    f"after '--' ({self._command_prog()} -- {token})"
                )
        return ""

    def _command_prog(self) -> str:
        """`cosyserve normalize` rather than `cosyserve` when this is the top-level parser."""
        if self._subparsers is None:
            return self.prog
        command = next((token for token in self._seen_args if not token.startswith("-")), None)
        return f"{self.prog} {command}" if command else self.prog

    def unknown_flags(self) -> list[str]:
        """The flag-like tokens that name none of this parser's options (nor abbreviate one)."""
        unknown = []
        for token in getattr(self, "_seen_args", []):
            if token == "--":
                break
            name = token.split("=", 1)[0]
            if not name.startswith("-") or looks_like_text(token) or name in ("-", "--"):
                continue
            if not any(option.startswith(name) for option in self._option_string_actions):
                unknown.append(token)
        return unknown

    def error(self, message: str) -> NoReturn:
        unknown = self.unknown_flags()
        if message.startswith("the following arguments are required") and unknown:
            # argparse checks required options before it reports a misspelt one; the typo is the news
            message = f"unrecognized arguments: {' '.join(unknown)}"
        hint = self.dash_text_hint(message)
        # `cosyserve normalize` for arguments the top level found over; a command that is no command's
        # name is this parser's own error (`cosyserve frobnicate --help` would fail too)
        prog = self.prog if "invalid choice" in message else self._command_prog()
        self.exit(int(ExitCode.USAGE), f"{prog}: error: {message}{hint}; see `{prog} --help`\n")


def server_url(value: str) -> str:
    """--server's value: an http(s) URL (a bare host:port is a usage error naming the fix, not a server
    that "could not be reached")."""
    if urlsplit(value).scheme not in ("http", "https"):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a server URL: give it with its scheme, e.g. http://{value.split('://')[-1]}"
        )
    return value.rstrip("/")
