"""Runs of sentence punctuation collapsed to their first mark, as the official sentence split reads them.

The official `split_paragraph` ends a sentence at each of these marks and drops every mark that follows
another with nothing in between, so `你好。。。！！` is read as `你好。` and `Really?!` as `Really?`.
cosyserve's splitter keeps runs together, so the collapsing happens here, in the normalisation. Runs at
the very start of a text (nothing to end) are left to the splitter, and `……` is not one of the marks
(kept, as the official keeps it).
"""

from __future__ import annotations

import re

from cosyserve.frontend.text.official import Language

# The official sentence-end marks (split_paragraph's `pounc`) per language.
SENTENCE_MARKS = {"zh": "。？！；：、.?!;", "en": ".?!;:"}
_RUNS = {
    lang: re.compile(rf"(?<=[^{re.escape(marks)}])([{re.escape(marks)}])[{re.escape(marks)}]+")
    for lang, marks in SENTENCE_MARKS.items()
}


def collapse_runs(text: str, lang: Language) -> tuple[str, list[str]]:
    """`text` with each run of sentence marks cut to its first mark, and the runs that were cut."""
    runs: list[str] = []

    def first(match: re.Match[str]) -> str:
        runs.append(match.group())
        return match[1]

    return _RUNS[lang].sub(first, text), runs
