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
            f"model directory {spec} does not exist (and it is not a model id like owner/name)"
        )
    from cosyserve.modeldir.download import DEFAULT_RETRY_BUDGET_S, default_target_dir, download_model

    target = default_target_dir(spec) if models_root is None else models_root / spec.split("/")[1]
    if (target / "cosyvoice3.yaml").is_file():
        return ModelDir.open(target)
    if not download:
        raise ModelDirError(f"model {spec} is not downloaded yet: run `cosyserve download {spec}`")
    budget = DEFAULT_RETRY_BUDGET_S if retry_budget_s is None else retry_budget_s
    return ModelDir.open(download_model(spec, target_dir=target, retry_budget_s=budget))
