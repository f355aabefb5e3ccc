"""Files a command writes, checked before its work starts."""

from __future__ import annotations

from pathlib import Path

from cosyserve.errors import InputError


def check_writable(paths: list[Path]) -> None:
    """Each file a command will write can be: its folder is made and the file opened for writing now, so
    an unwritable path (a read-only folder, a folder's name) fails in one line before any synthesis."""
    for path in paths:
        if path.is_dir():
            raise InputError(f"{path} is a folder: give a file name to write")
        existed = path.exists()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("ab"):
                pass
        except OSError as exc:
            raise InputError(
                f"cannot write {path}: {exc.strerror or exc}; check the path and its permissions"
            ) from exc
        if not existed:
            path.unlink(missing_ok=True)
