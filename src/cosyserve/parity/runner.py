"""`cosyserve parity DIR`: run every check whose golden file is present in DIR, one line per result."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cosyserve.errors import CosyServeError, InputError
from cosyserve.modeldir.model_dir import FIX_HINT, ModelDir
from cosyserve.parity import CheckResult

# golden file -> check module (cosyserve.parity.<module>.run). Order: cheapest first.
GOLDEN_CHECKS: dict[str, str] = {
    "tokenizer_cases.json": "tokenizer",
    "features.npz": "features",
    "resample.npz": "resample",
    "llm.npz": "llm",
    "flow.npz": "flow",
    "hift.npz": "hift",
    "token2wav.npz": "token2wav",
}


@dataclass(frozen=True)
class ParityLine:
    """One printed line: a passing/failing comparison or a check that could not run."""

    check: str
    result: CheckResult | None
    error: str = ""

    @property
    def passed(self) -> bool:
        return self.result is not None and self.result.passed

    def render(self) -> str:
        if self.result is None:
            return f"FAIL  {self.check:<34} {self.error}"
        r = self.result
        status = "ok  " if r.passed else "FAIL"
        detail = f"  ({r.detail})" if r.detail else ""
        return f"{status}  {r.name:<34} max|diff| {r.max_abs_diff:.3e}  tol {r.tolerance:.0e}{detail}"


def _load_check(module: str) -> Callable[[ModelDir, Path], list[CheckResult]] | None:
    try:
        return importlib.import_module(f"cosyserve.parity.{module}").run
    except ModuleNotFoundError as exc:
        if exc.name == f"cosyserve.parity.{module}":
            return None
        raise


def _checkpoint_lines(model_dir: ModelDir) -> Iterator[ParityLine]:
    """Each checkpoint must load strictly into the architecture its config describes."""
    from cosyserve.engine.loading import CHECKPOINT_LOADERS

    for name, load in CHECKPOINT_LOADERS.items():
        try:
            load(model_dir)
        except CosyServeError as exc:
            yield ParityLine(f"load {name}", None, str(exc).splitlines()[0])
            continue
        yield ParityLine(f"load {name}", CheckResult(f"load {name} (strict)", 0.0, 0.0))


def run_parity(fixture_dir: Path) -> Iterator[ParityLine]:
    """Yield one line per comparison for the fixture directory `fixture_dir` (holding `model/`).

    Raises InputError when `fixture_dir` is no fixture directory at all (no `model/` in it)."""
    if not (fixture_dir / "model").is_dir():
        raise InputError(
            f"{fixture_dir} holds no model/: pass a parity fixture directory (model/ and golden files, "
            "e.g. ../shared/parity/tiny)"
        )
    try:
        model_dir = ModelDir.open(fixture_dir / "model", require_onnx=False)
        _ = model_dir.config
    except CosyServeError as exc:  # the model-directory hint (`--model`) is not a flag of `parity`
        problem = str(exc).replace(f"; {FIX_HINT}", "")
        yield ParityLine("model directory", None, f"{problem}; copy the fixture directory again")
        return
    yield from _checkpoint_lines(model_dir)
    found_any = False
    for golden, module in GOLDEN_CHECKS.items():
        if not (fixture_dir / golden).is_file():
            continue
        found_any = True
        check = _load_check(module)
        if check is None:
            yield ParityLine(golden, None, "not implemented yet")
            continue
        try:
            results = check(model_dir, fixture_dir)
        except CosyServeError as exc:
            yield ParityLine(golden, None, str(exc).splitlines()[0])
            continue
        for result in results:
            yield ParityLine(golden, result)
    if not found_any:
        yield ParityLine("golden files", None, f"none of {', '.join(GOLDEN_CHECKS)} found in {fixture_dir}")
