"""Where the CLI's voices, keys and labels live, and the check that a command reading them found them.

`voices list --data-dir /tmp/tpyo` used to create the misspelt folder with an empty database and answer
"no voices yet"; a command that only reads or changes what is there now says the folder is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

from cosyserve.errors import InputError


def default_data_dir() -> Path:
    """$COSYSERVE_DATA_DIR, else what `serve` uses (`./cosyserve-data` when it exists, else
    `~/.local/share/cosyserve`): the CLI and the server it runs beside share one library."""
    if os.environ.get("COSYSERVE_DATA_DIR"):
        return Path(os.environ["COSYSERVE_DATA_DIR"]).expanduser()
    from cosyserve.service.setting_groups import default_data_dir as server_default

    return server_default()


def existing_data_dir(data_dir: Path | str | None) -> Path:
    """The data directory a reading command names; InputError when it is not there."""
    root = Path(data_dir).expanduser() if data_dir else default_data_dir()
    if not root.is_dir():
        where = "--data-dir" if data_dir else "$COSYSERVE_DATA_DIR or --data-dir"
        raise InputError(
            f"no cosyserve data at {root} (no such folder): check {where}; `cosyserve serve`, "
            "`voices add` and `keys create` make it"
        )
    return root
