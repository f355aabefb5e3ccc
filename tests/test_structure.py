"""The package's shape: the layer rules (which part may import which), no import circles anywhere (imports
inside functions and under TYPE_CHECKING count too), and modules and functions of a readable size in the
layers that serve requests."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SRC = REPO_ROOT / "src"
PACKAGE = "cosyserve"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
SIZED = ("service", "api", "ui", "commands")  # model/, engine/ and bench/ are measured by their own owners
# Which part of the package may import which (data flows down, results flow up; nothing reaches upward).
# A part is a subpackage or a top-level module; `docs/architecture.md` draws the same table.
LAYERS: dict[str, frozenset[str]] = {
    "model": frozenset(),
    "frontend": frozenset(),
    "modeldir": frozenset({"model", "frontend"}),
    "engine": frozenset({"model", "modeldir"}),
    "service": frozenset({"engine", "frontend", "modeldir"}),
    "api": frozenset({"service", "frontend"}),
    "ui": frozenset({"service", "frontend"}),  # through its bridge only: UI_BRIDGE below
    "commands": frozenset({"api", "ui", "service", "engine", "frontend", "modeldir", "exit_codes"}),
    "bench": frozenset({"engine", "model", "modeldir", "frontend", "service"}),  # service: take checks
    "parity": frozenset({"engine", "model", "modeldir", "frontend"}),
    "cli": frozenset({"commands", "bench", "parity", "modeldir", "exit_codes"}),
    "exit_codes": frozenset(),
    "errors": frozenset({"exit_codes"}),  # ERROR_TABLE names each error's exit status
    "limits": frozenset(),
    "build_info": frozenset(),
}
# the package root, the error types, the input limits, which code is running
OPEN_TO_ALL = frozenset({PACKAGE, "errors", "limits", "build_info"})
# Inside ui/ only the bridge reaches the service and the frontend; the pages import the bridge, and the
# bridge imports no page.
UI_BRIDGE = f"{PACKAGE}.ui.bridge"
UI_THROUGH_BRIDGE = frozenset({"service", "frontend"})
# Circles that a change under way removes; each must still exist (delete its line once it is gone).
KNOWN_CIRCLES: set[frozenset[str]] = set()


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package is its __init__.py)."""
    found = {}
    for path in (SRC / PACKAGE).rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports anywhere in its file (functions included)."""

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets.update(resolve(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # `from pkg import module` imports that module
                targets.add(
                    resolve(f"{base}.{alias.name}") if f"{base}.{alias.name}" in known else resolve(base)
                )
    targets.discard(None)
    targets.discard(name)
    return {t for t in targets if t is not None}


def part_of(name: str) -> str:
    """The layer of a module: `cosyserve.service.stores.jobs` -> `service`; the root -> `cosyserve`."""
    return name.split(".")[1] if "." in name else name


def in_bridge(name: str) -> bool:
    return name == UI_BRIDGE or name.startswith(UI_BRIDGE + ".")


def wrong_arrow(source: str, target: str) -> str | None:
    """Why `source` may not import `target` (None: it may)."""
    here, there = part_of(source), part_of(target)
    if here == there:
        if here == "ui" and in_bridge(source) and not in_bridge(target):
            return f"ui bridge -> ui page ({target}): the bridge serves the pages and imports none of them"
        return None
    if there in OPEN_TO_ALL:
        return None
    if here not in LAYERS:
        return f"{here} has no row in LAYERS (tests/test_structure.py): say what it may import"
    if there not in LAYERS[here]:
        allowed = ", ".join(sorted(LAYERS[here])) or "nothing but errors"
        return f"{here} -> {there} ({target}): {here} may import {allowed}"
    if here == "ui" and there in UI_THROUGH_BRIDGE and not in_bridge(source):
        return f"ui -> {there} ({target}): a UI page goes through {UI_BRIDGE} (re-export what it needs there)"
    return None


def layer_violations(known: dict[str, Path]) -> list[str]:
    """One line per import that breaks the layer rules: the file, the wrong arrow and the rule."""
    found = []
    for name, path in sorted(known.items()):
        for target in sorted(imported(name, path, known)):
            if (reason := wrong_arrow(name, target)) is not None:
                where = path.relative_to(SRC) if path.is_relative_to(SRC) else path
                found.append(f"{where}: {reason}")
    return found


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected groups of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(frozenset(group))
    return found


def test_every_import_follows_the_layer_rules() -> None:
    wrong = layer_violations(modules())
    rules = "imports against the layer rules (LAYERS in tests/test_structure.py):\n"
    assert not wrong, rules + "\n".join(wrong)


def test_the_layer_rules_catch_a_ui_page_importing_the_service(tmp_path: Path) -> None:
    page = tmp_path / "synthetic_page.py"
    page.write_text(
        "from cosyserve.ui.bridge import UiBridge\n"
        "def build():\n    from cosyserve.service.stores.outputs import StoredOutput\n",
        encoding="utf-8",
    )
    known = {**modules(), f"{PACKAGE}.ui.synthetic_page": page}
    assert layer_violations(known) == [
        f"{page}: ui -> service (cosyserve.service.stores.outputs): "
        "a UI page goes through cosyserve.ui.bridge (re-export what it needs there)"
    ]


def test_the_layer_rules_name_each_wrong_arrow() -> None:
    assert wrong_arrow("cosyserve.ui.bridge.voices", "cosyserve.service.stores.voices") is None
    assert wrong_arrow("cosyserve.ui.generate", "cosyserve.ui.bridge") is None
    assert wrong_arrow("cosyserve.api.tts", "cosyserve.errors") is None
    assert "ui -> frontend" in (wrong_arrow("cosyserve.ui.preview", "cosyserve.frontend.text.tags") or "")
    assert "ui -> engine" in (wrong_arrow("cosyserve.ui.bridge.facade", "cosyserve.engine.pipeline") or "")
    assert "model -> service" in (wrong_arrow("cosyserve.model.flow", "cosyserve.service.settings") or "")
    assert "api -> ui" in (wrong_arrow("cosyserve.api.app", "cosyserve.ui.app") or "")
    assert "imports none" in (wrong_arrow("cosyserve.ui.bridge.facade", "cosyserve.ui.i18n") or "")
    assert "no row in LAYERS" in (wrong_arrow("cosyserve.newpart.x", "cosyserve.service.settings") or "")


def test_the_import_graph_has_no_circles() -> None:
    known = modules()
    graph = {name: imported(name, path, known) for name, path in known.items()}
    found = set(circles(graph))
    new = [sorted(group) for group in found - KNOWN_CIRCLES]
    assert not new, f"import circles (move the shared part down a layer): {new}"
    gone = [sorted(group) for group in KNOWN_CIRCLES - found]
    assert not gone, f"these circles are gone: remove them from KNOWN_CIRCLES: {gone}"


def test_the_circle_finder_sees_lazy_imports(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [frozenset({"a", "b", "c"})]
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from cosyserve.errors import InputError\n", encoding="utf-8")
    assert imported("cosyserve.m", source, modules()) == {"cosyserve.errors"}


def test_modules_and_functions_stay_readable() -> None:
    too_long = []
    for layer in SIZED:
        for path in sorted((SRC / PACKAGE / layer).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            where = path.relative_to(SRC)
            if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
                too_long.append(f"{where}: {lines} lines (at most {MAX_MODULE_LINES})")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        too_long.append(f"{where}:{node.lineno} {node.name}: {length} lines")
    assert not too_long, "split these by what they do:\n" + "\n".join(too_long)
