"""The package's shape: no import circles anywhere (imports inside functions and under TYPE_CHECKING
count too), and modules and functions of a readable size in the layers that serve requests."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SRC = REPO_ROOT / "src"
PACKAGE = "cosyserve"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
SIZED = ("service", "api", "ui", "commands")  # model/, engine/ and bench/ are measured by their own owners
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
