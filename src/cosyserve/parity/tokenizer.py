"""Parity of the text tokenizer with `tokenizer_cases.json`: every case's ids must match exactly."""

from __future__ import annotations

import json
from pathlib import Path

from cosyserve.errors import ModelDirError
from cosyserve.frontend.tokenizer import TextTokenizer
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.parity import CheckResult

GOLDEN_FILE = "tokenizer_cases.json"


def run(model_dir: ModelDir, fixture_dir: Path) -> list[CheckResult]:
    """Two exact checks: the special-token list (order decides ids) and the ids of every text case."""
    golden_path = Path(fixture_dir) / GOLDEN_FILE
    try:
        golden = json.loads(golden_path.read_text(encoding="utf-8"))
        cases = [(case["text"], list(case["ids"])) for case in golden["cases"]]
        expected_specials = list(golden["special_tokens"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelDirError(f"{golden_path} cannot be read ({exc}); regenerate the parity fixtures") from exc
    tokenizer = TextTokenizer.from_dir(model_dir.tokenizer_dir)
    return [_check_specials(tokenizer, expected_specials), _check_cases(tokenizer, cases)]


def _check_specials(tokenizer: TextTokenizer, expected: list[str]) -> CheckResult:
    name = "tokenizer special tokens"
    actual = list(tokenizer.special_tokens)
    if actual == expected:
        return CheckResult(name, 0.0, 0.0, f"{len(actual)} tokens")
    if len(actual) != len(expected):
        return CheckResult(name, float("inf"), 0.0, f"{len(actual)} tokens, expected {len(expected)}")
    at = _first_difference(actual, expected)
    return CheckResult(name, float("inf"), 0.0, f"entry {at} is {actual[at]!r}, expected {expected[at]!r}")


def _check_cases(tokenizer: TextTokenizer, cases: list[tuple[str, list[int]]]) -> CheckResult:
    name = "tokenizer ids"
    for index, (text, expected) in enumerate(cases):
        actual = tokenizer.encode(text)
        if actual != expected:
            at = _first_difference(actual, expected)
            detail = (
                f"case {index} {text[:40]!r}: first difference at id {at}: got {actual[at : at + 5]}, "
                f"expected {expected[at : at + 5]} ({len(actual)} ids, expected {len(expected)})"
            )
            return CheckResult(name, float("inf"), 0.0, detail)
    return CheckResult(name, 0.0, 0.0, f"{len(cases)} cases")


def _first_difference(actual: list, expected: list) -> int:
    """Index of the first differing entry; the shorter length when one list is a prefix of the other."""
    for index, (a, e) in enumerate(zip(actual, expected, strict=False)):
        if a != e:
            return index
    return min(len(actual), len(expected))
