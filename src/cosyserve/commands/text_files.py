"""A text a command reads from a file (--text-file), with what was wrong said the user's way."""

from __future__ import annotations

from pathlib import Path

from cosyserve.errors import InputError


def read_text_file(path: str) -> str:
    """The file's text (UTF-8); InputError naming the file and the fix."""
    where = Path(path)
    if where.is_dir():
        raise InputError(f"--text-file {path} is a folder: give the text file itself")
    try:
        return where.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"--text-file {path} is not UTF-8 text (byte {exc.start}): save it as UTF-8 and run again"
        ) from exc
    except OSError as exc:
        raise InputError(f"cannot read --text-file {path}: {exc.strerror or exc}") from exc
