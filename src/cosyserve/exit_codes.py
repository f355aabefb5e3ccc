"""The exit statuses of every `cosyserve` command, defined once (the README's table is this one); which
error ends a command with which status is a column of the error table (`errors.exit_code_for`).

A script can tell what to do from the status alone: 2 means fix the command line, 3 means install or
download something (or reach a server), 1 means the work itself failed.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # done
    FAILED = 1  # the command ran and its work failed: a load, a synthesis, a parity check, items of a batch
    USAGE = 2  # the command line or its input is wrong: a flag, an argument, a text, a file, a setting
    UNAVAILABLE = 3  # something it needs is not here: a model, an extra, the hubs or a server out of reach
    INTERRUPTED = 130  # Ctrl-C
    OUTPUT_CLOSED = 141  # what read its output went away (piped into `head`): as SIGPIPE ends a tool


# What each status means, for `cosyserve --help` and the README (tests check the README lists each).
MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "done",
    ExitCode.FAILED: "the work failed (a model that does not load, a synthesis error, a parity check, "
    "failed items of a batch)",
    ExitCode.USAGE: "wrong command line or input (flag, argument, text, file, setting): fix the command",
    ExitCode.UNAVAILABLE: "something needed is missing or out of reach (a model not downloaded, the hubs "
    "or a server unreachable, an extra not installed): install or download it",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
    ExitCode.OUTPUT_CLOSED: "what read its output stopped reading (a pipe into head)",
}


def epilog() -> str:
    """The table as `--help` shows it."""
    rows = "\n".join(f"  {int(code):<4} {text}" for code, text in MEANINGS.items())
    return f"exit status:\n{rows}"
