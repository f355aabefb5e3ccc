"""What to tell an operator when the model can't be loaded: what failed, the one reason, what to do.

`serve` prints it and exits when its first load fails; a worker raises it; it fits in one line.
"""

from __future__ import annotations

from cosyserve.errors import CheckpointError, ConfigError, InputError, ModelDirError

MAX_MESSAGE_CHARS = 400
_REASON_CHARS = 160
KEEP_SERVING_HINT = "(--keep-serving-on-load-error keeps the server up to fix it from the admin page)"


def load_failure_message(model: str, error: BaseException) -> str:
    """One line (under MAX_MESSAGE_CHARS) naming what failed, why, and what to do about it."""
    from cosyserve.modeldir.download import DownloadError, root_cause

    try_demo = "" if model == "demo" else ", or try --model demo"  # not to a user already on it
    if isinstance(error, DownloadError):
        reason = error.reason
        if "Name or service not known" in reason or "gaierror" in reason:
            reason = "no network: the hubs' names can't be resolved"
        advice = (
            f"the model hubs are out of reach: run `cosyserve download {model}` where they are reachable "
            f"and pass --model DIR{try_demo}" + (" (random weights, works offline)" if try_demo else "")
        )
    elif isinstance(error, InputError) and "device" in str(error).lower():
        reason = str(error)
        advice = f"use --device cpu (or check the GPU with nvidia-smi){try_demo}"
    elif isinstance(error, (ModelDirError, CheckpointError, ConfigError)):
        reason = str(error)
        advice = (
            f"run `cosyserve download {model}` to fetch or repair it, or pass another --model DIR{try_demo}"
        )
    else:
        reason = root_cause(error)
        advice = "try --device cpu" + (", or --model demo to check the installation" if try_demo else "")
    reason = " ".join(reason.split()).rstrip(".")
    if len(reason) > _REASON_CHARS:
        reason = reason[: _REASON_CHARS - 1].rstrip() + "…"
    message = f"could not load model {model}: {reason}. What to do: {advice}"
    hinted = f"{message} {KEEP_SERVING_HINT}"
    return hinted if len(hinted) < MAX_MESSAGE_CHARS else message[: MAX_MESSAGE_CHARS - 1]
