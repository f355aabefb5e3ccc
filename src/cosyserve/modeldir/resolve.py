"""`--model DIR|MODEL_ID|demo` → a validated model directory, downloading or writing it when needed."""

from __future__ import annotations

from pathlib import Path

from cosyserve.errors import ModelDirError
from cosyserve.modeldir.model_dir import DEFAULT_MODEL_ID, ModelDir

DEMO = "demo"


def demo_model_dir(models_root: Path | None = None) -> Path:
    from cosyserve.modeldir.download import default_models_root

    return (models_root or default_models_root()) / "cosyserve-demo"


def resolve_model(
    spec: str | None,
    *,
    models_root: Path | None = None,
    download: bool = True,
    retry_budget_s: float | None = None,
) -> ModelDir:
    """A directory path is used as is; `demo` writes the demo model once; a model id is downloaded
    (giving up after `retry_budget_s` seconds of attempts that fetch nothing; None: the default).

    Model ids look like `owner/name`; a spec that names an existing directory always wins.
    """
    spec = (spec or DEFAULT_MODEL_ID).strip()
    if spec == DEMO:
        target = demo_model_dir(models_root)
        if not (target / "cosyserve_demo.json").is_file():
            from cosyserve.modeldir.demo_model import write_demo_model

            write_demo_model(target, seed=0, overwrite=True)
        return ModelDir.open(target)
    path = Path(spec).expanduser()
    if path.is_dir():
        return ModelDir.open(path)
    if spec.count("/") != 1 or spec.startswith((".", "/", "~")):
        raise ModelDirError(
            f"model directory {spec} does not exist (and it is not a model id like owner/name): pass a model "
            "directory, a model id (downloaded if missing) or demo"
        )
    from cosyserve.modeldir.download import (
        DEFAULT_RETRY_BUDGET_S,
        DownloadError,
        default_target_dir,
        download_model,
    )

    target = default_target_dir(spec) if models_root is None else models_root / spec.split("/")[1]
    if (target / "cosyvoice3.yaml").is_file():
        return ModelDir.open(target)
    if not download:
        raise ModelDirError(f"model {spec} is not downloaded yet: run `cosyserve download {spec}`")
    budget = DEFAULT_RETRY_BUDGET_S if retry_budget_s is None else retry_budget_s
    try:
        return ModelDir.open(download_model(spec, target_dir=target, retry_budget_s=budget))
    except DownloadError as exc:  # the next step for someone trying cosyserve without the hubs
        raise DownloadError(
            f"{str(exc).rstrip('.')}. To try cosyserve offline: --model demo (random weights: noise); "
            f"for the real model run `cosyserve download {spec}` where a hub is reachable",
            model_id=exc.model_id,
            reason=exc.reason,
        ) from exc


def unreachable_download(spec: str | None, *, models_root: Path | None = None) -> ModelDirError | None:
    """For a start-up that would download `spec`: the error it will end with when no hub can be reached
    (found in seconds by `hub_probe`), else None (a local or demo model, one downloaded, a hub reachable)."""
    spec = (spec or DEFAULT_MODEL_ID).strip()
    if spec == DEMO or Path(spec).expanduser().is_dir() or spec.count("/") != 1:
        return None
    from cosyserve.modeldir.download import DownloadError, default_target_dir, source_order
    from cosyserve.modeldir.hub_probe import probe_hubs

    target = default_target_dir(spec) if models_root is None else models_root / spec.split("/")[1]
    if (target / "cosyvoice3.yaml").is_file():
        return None
    try:
        reasons = probe_hubs(source_order(None))
    except ModelDirError as exc:  # an unknown COSYSERVE_DOWNLOAD_SOURCE
        return exc
    if not all(reasons.values()):
        return None
    summary = " | ".join(f"{hub}: {reason}" for hub, reason in reasons.items())
    return DownloadError(
        f"could not download {spec}: no hub can be reached ({summary})",
        model_id=spec,
        reason=next(reason for reason in reversed(reasons.values()) if reason),
    )
