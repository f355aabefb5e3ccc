"""Read hyperpyyaml files (the official `cosyvoice3.yaml`) as plain data.

The official code builds objects straight from YAML tags such as `!new:cosyvoice.llm.llm.CosyVoice3LM`.
We never import or construct anything a YAML file names: a tagged mapping becomes a `Tagged` record
holding the tag and its arguments, and `!ref <name>` references (with simple arithmetic such as
`<chunk_size> * <token_mel_ratio>`) are resolved against the top-level keys.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cosyserve.errors import ConfigError

_REF_PATTERN = re.compile(r"<([^<>]+)>")
_ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


@dataclass(frozen=True)
class Tagged:
    """A `!new:`, `!name:` or `!apply:` node: the tag kind, the dotted target it names, its arguments."""

    kind: str  # "new" | "name" | "apply"
    target: str  # dotted path, e.g. "cosyvoice.flow.DiT.dit.DiT"; never imported
    kwargs: dict[str, Any] = field(default_factory=dict)
    args: tuple[Any, ...] = ()

    @property
    def class_name(self) -> str:
        return self.target.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class _Ref:
    expression: str  # e.g. "<chunk_size> * <token_mel_ratio>"


class _DataLoader(yaml.SafeLoader):
    """A SafeLoader that turns hyperpyyaml tags into data instead of objects."""


def _construct_tagged(loader: _DataLoader, tag_suffix: str, node: yaml.Node, kind: str) -> Tagged:
    if isinstance(node, yaml.MappingNode):
        return Tagged(kind, tag_suffix, kwargs=loader.construct_mapping(node, deep=True))
    if isinstance(node, yaml.SequenceNode):
        return Tagged(kind, tag_suffix, args=tuple(loader.construct_sequence(node, deep=True)))
    value = loader.construct_scalar(node)
    return Tagged(kind, tag_suffix, args=(value,) if value not in ("", None) else ())


for _kind in ("new", "name", "apply"):
    _DataLoader.add_multi_constructor(
        f"!{_kind}:",
        lambda loader, suffix, node, kind=_kind: _construct_tagged(loader, suffix, node, kind),
    )
_DataLoader.add_constructor("!ref", lambda loader, node: _Ref(str(loader.construct_scalar(node))))
# PyYAML's float rule misses "1e-06" style numbers without a dot; hyperpyyaml files use them.
_DataLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def _evaluate(expression: str, scope: dict[str, Any], resolving: tuple[str, ...]) -> Any:
    names = _REF_PATTERN.findall(expression)
    if _REF_PATTERN.fullmatch(expression.strip()):
        return _lookup(names[0], scope, resolving)
    values = {f"_r{i}": _lookup(name, scope, resolving) for i, name in enumerate(names)}
    counter = iter(range(len(names)))
    python_expr = _REF_PATTERN.sub(lambda _m: f"_r{next(counter)}", expression)
    try:
        tree = ast.parse(python_expr, mode="eval")
    except SyntaxError as exc:
        raise ConfigError(f"cannot parse !ref expression {expression!r}") from exc
    return _eval_node(tree.body, values, expression)


def _eval_node(node: ast.AST, values: dict[str, Any], expression: str) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.Name) and node.id in values:
        return values[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left = _eval_node(node.left, values, expression)
        right = _eval_node(node.right, values, expression)
        return _ARITHMETIC[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval_node(node.operand, values, expression)
    raise ConfigError(
        f"unsupported !ref expression {expression!r}: only numbers, <refs> and + - * / are allowed"
    )


def _lookup(dotted: str, scope: dict[str, Any], resolving: tuple[str, ...]) -> Any:
    if dotted in resolving:
        raise ConfigError(f"circular !ref: {' -> '.join((*resolving, dotted))}")
    head, *rest = dotted.split(".")
    if head not in scope:
        raise ConfigError(f"!ref <{dotted}> names a key that the file does not define")
    value = _resolve(scope[head], scope, (*resolving, dotted))
    for part in rest:
        if isinstance(value, Tagged):
            value = value.kwargs
        if not isinstance(value, dict) or part not in value:
            raise ConfigError(f"!ref <{dotted}>: no key {part!r}")
        value = value[part]
    return value


def _resolve(value: Any, scope: dict[str, Any], resolving: tuple[str, ...] = ()) -> Any:
    if isinstance(value, _Ref):
        return _resolve(_evaluate(value.expression, scope, resolving), scope, resolving)
    if isinstance(value, Tagged):
        return Tagged(
            value.kind,
            value.target,
            kwargs={k: _resolve(v, scope, resolving) for k, v in value.kwargs.items()},
            args=tuple(_resolve(v, scope, resolving) for v in value.args),
        )
    if isinstance(value, dict):
        return {k: _resolve(v, scope, resolving) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, scope, resolving) for v in value]
    return value


def load_hyperyaml(path: Path) -> dict[str, Any]:
    """Parse a hyperpyyaml file into plain dicts, lists, scalars and `Tagged` records, refs resolved."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        raw = yaml.load(text, Loader=_DataLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path.name} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path.name} must be a YAML mapping at the top level")
    return {key: _resolve(value, raw) for key, value in raw.items()}
