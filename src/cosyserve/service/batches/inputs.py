"""What a batch is made of: items read from JSON, JSON lines, CSV (with a header row) or plain text.

Each item is one text in one voice with its own optional `voice`, `instruct`, `seed`, `speed`, `volume`,
`format`, `takes`, `thresholds` (quality thresholds; JSON text in a CSV cell) and `name` (the file's name);
what an item leaves out comes from the batch's shared settings (a threshold it leaves out too). A
file that cannot be read as a whole (not UTF-8, not CSV, no `text` column, too many items) is refused; an
item that cannot be spoken (no text, too long, a seed that is not a number) is kept with its reason and
fails alone, so the others still run and every line keeps its number.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cosyserve.errors import InputError
from cosyserve.frontend.subtitles import Cue
from cosyserve.frontend.text.prepare import quoted
from cosyserve.frontend.text.split import has_content, require_visible_text
from cosyserve.limits import (
    DEFAULT_MAX_BATCH_ITEMS,
    DEFAULT_MAX_TEXT_CHARS,
    MAX_SPEED,
    MAX_VOLUME,
    MIN_SPEED,
    MIN_VOLUME,
)
from cosyserve.service.audio_formats import FORMATS
from cosyserve.service.batches.dub_plan import charge_shares, check_track_length
from cosyserve.service.quality import MAX_TAKES
from cosyserve.service.quality.overrides import checked_against
from cosyserve.service.quality.scores import QualityThresholds
from cosyserve.service.requests import MAX_SEED

SETTINGS = ("voice", "instruct", "seed", "speed", "volume", "format", "takes", "thresholds")
ITEM_FIELDS = ("text", *SETTINGS, "name")  # what an item may set
TEXT_FIELDS = ("text", "voice", "instruct", "format")
SHARED_FIELDS = (*SETTINGS, "prompt_text")  # what a batch sets for all its items
KINDS = ("json", "jsonl", "csv", "txt")
NAME_CHARS = re.compile(r"[^\w-]+")
MAX_NAME = 48


@dataclass(frozen=True)
class ItemSpec:
    """One item as read: its file name, its parameters (shared settings filled in), and why it cannot run
    (None when it can)."""

    name: str
    params: dict[str, Any]
    problem: str | None = None

    def as_row(self) -> dict[str, Any]:
        """What `BatchStore.add` takes."""
        row: dict[str, Any] = {"name": self.name, "params": self.params}
        if self.problem is not None:
            row.update(error_code="invalid_input", error_message=self.problem)
        return row


@dataclass(frozen=True)
class BatchRules:
    """The limits items are checked against."""

    max_items: int = DEFAULT_MAX_BATCH_ITEMS
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    has_prompt: bool = False  # the batch carries an uploaded recording: items need no voice
    shared: Mapping[str, Any] = field(default_factory=dict)  # shared settings (SHARED_FIELDS)
    max_track_s: float | None = None  # a dub's track at most this long (`max_dub_track_s`; None: no limit)
    thresholds: QualityThresholds = field(default_factory=QualityThresholds)  # the server's, overridden


def kind_of(filename: str | None, content_type: str | None = None) -> str:
    """json, jsonl, csv or txt from a file name's suffix or a content type (InputError otherwise)."""
    suffix = (filename or "").rsplit(".", 1)[-1].lower() if filename and "." in filename else ""
    by_suffix = {"json": "json", "jsonl": "jsonl", "ndjson": "jsonl", "csv": "csv", "txt": "txt"}
    if suffix in by_suffix:
        return by_suffix[suffix]
    media = (content_type or "").split(";")[0].strip().lower()
    by_type = {
        "application/json": "json",
        "application/jsonl": "jsonl",
        "application/x-ndjson": "jsonl",
        "application/x-jsonlines": "jsonl",
        "text/csv": "csv",
        "text/plain": "txt",
    }
    if media in by_type:
        return by_type[media]
    raise InputError(
        f"can't tell what kind of batch file {filename or media or 'this'!r} is: "
        "use a .json, .jsonl, .csv (with a header row) or .txt file (one text per line)"
    )


def read_items(data: bytes | str, kind: str, rules: BatchRules) -> list[ItemSpec]:
    """The items of a batch file of `kind` (see KINDS), each checked (`ItemSpec.problem`)."""
    text = _decode(data)
    if kind == "json":
        raw = _json_items(text)
    elif kind == "jsonl":
        raw = [_jsonl_line(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    elif kind == "csv":
        raw = _csv_rows(text)
    elif kind == "txt":
        raw = [{"text": line.strip()} for line in text.splitlines() if line.strip()]
    else:
        raise InputError(f"unknown batch kind {kind!r}: use one of {', '.join(KINDS)}")
    return items_from(raw, rules)


def items_from(raw: Iterable[Mapping[str, Any] | str], rules: BatchRules) -> list[ItemSpec]:
    """Items from already parsed values (a JSON body's list): checked, shared settings filled in."""
    values = list(raw)
    checked_against(rules.thresholds, rules.shared.get("thresholds"))  # every item's: the batch is refused
    if not values:
        raise InputError("the batch has no items: give at least one text")
    if len(values) > rules.max_items:
        raise InputError(
            f"the batch has {len(values)} items, the limit is {rules.max_items}: "
            "split it or raise max_batch_items"
        )
    return [_item(n, value, rules) for n, value in enumerate(values, start=1)]


def cue_items(cues: list[Cue], rules: BatchRules) -> list[ItemSpec]:
    """One item per cue of a subtitle file (cues in time order): its text plus where it goes (start, end,
    and the next cue's start, which it must never run over), what the file called it, and its share of the
    track's charge (`dub_plan`). InputError when the track would be longer than `rules.max_track_s`."""
    if len(cues) > rules.max_items:
        raise InputError(f"the subtitle file has {len(cues)} cues, the limit is {rules.max_items}: split it")
    checked_against(rules.thresholds, rules.shared.get("thresholds"))
    check_track_length(cues, rules.max_track_s)
    items = []
    for i, (cue, share) in enumerate(zip(cues, charge_shares(cues), strict=True)):
        limit = cues[i + 1].start_s if i + 1 < len(cues) else cue.end_s
        value = {"text": cue.text, "name": f"cue{cue.index}"}
        item = _item(cue.index, value, rules)
        placing = {
            "start_s": cue.start_s,
            "end_s": cue.end_s,
            "limit_s": limit,
            "cue_id": cue.cue_id or str(cue.index),
            "file_position": cue.file_position or cue.index,
            "share_s": share,
        }
        items.append(ItemSpec(item.name, {**item.params, **placing}, item.problem))
    return items


# -- reading ------------------------------------------------------------------------------------------


def _decode(data: bytes | str) -> str:
    if isinstance(data, str):
        return data.lstrip("\ufeff")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError("the batch file is not UTF-8 text: save it as UTF-8") from None


def _json_items(text: str) -> list[Any]:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"the batch file is not valid JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("items"), list):
        data = data["items"]
    if not isinstance(data, list):
        raise InputError('a JSON batch is a list of items, or an object with "items": [...]')
    return data


def _jsonl_line(number: int, line: str) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return {"_problem": f"line {number} is not valid JSON"}


def _csv_rows(text: str) -> list[dict[str, Any]]:
    try:
        reader = csv.DictReader(io.StringIO(text), restkey="_extra")
        header = [(name or "").strip().lower() for name in reader.fieldnames or []]
    except csv.Error as exc:
        raise InputError(f"the batch file is not CSV: {exc}") from None
    if "text" not in header:
        raise InputError(
            "a CSV batch needs a header row with a `text` column (and optionally "
            + ", ".join(f for f in ITEM_FIELDS if f != "text")
            + ")"
        )
    unknown = [name for name in header if name not in ITEM_FIELDS]
    if unknown:
        raise InputError(f"unknown CSV column {unknown[0]!r}: the columns are {', '.join(ITEM_FIELDS)}")
    reader.fieldnames = header
    try:
        rows = [
            {key: value for key, value in row.items() if value not in (None, "")}
            for row in reader
            if any((value or "").strip() for value in row.values() if isinstance(value, str))
        ]
    except csv.Error as exc:
        raise InputError(f"the batch file is not CSV: {exc}") from None
    for row in rows:
        if "_extra" in row:
            row["_problem"] = "the row has more values than the header has columns"
    return rows


# -- checking -----------------------------------------------------------------------------------------


def _item(number: int, value: Mapping[str, Any] | str, rules: BatchRules) -> ItemSpec:
    if isinstance(value, str):
        value = {"text": value}
    if not isinstance(value, Mapping):
        return ItemSpec(f"item{number}", {"text": ""}, f"item {number} is not an object with a text")
    unknown = [key for key in value if key not in ITEM_FIELDS and not str(key).startswith("_")]
    problem = value.get("_problem") or (
        f"unknown field {unknown[0]!r}: items have {', '.join(ITEM_FIELDS)}" if unknown else None
    )
    given = {key: v for key, v in value.items() if key in ITEM_FIELDS and key != "name" and v != ""}
    for key in TEXT_FIELDS:
        if key in given:
            try:
                given[key] = _as_text(given[key], key)
            except InputError as exc:
                problem, given[key] = problem or str(exc), None
    try:
        given["thresholds"] = _thresholds(given.get("thresholds"))
    except InputError as exc:
        problem, given["thresholds"] = problem or str(exc), None
    if given["thresholds"] is None:
        del given["thresholds"]
    params: dict[str, Any] = {key: rules.shared.get(key) for key in SHARED_FIELDS if key != "prompt_text"}
    if isinstance(given.get("thresholds"), Mapping) and isinstance(params.get("thresholds"), Mapping):
        given["thresholds"] = {**params["thresholds"], **given["thresholds"]}  # the item's over the batch's
    params.update(given)
    params["text"] = str(params.get("text") or "").strip()
    name = _file_name(_as_name(value.get("name")), params["text"], number)
    try:
        _check(params, rules)
    except InputError as exc:
        problem = problem or str(exc)
    if problem is not None:  # keep only what the views and manifests can show
        if not isinstance(params.get("thresholds"), Mapping):
            params["thresholds"] = None
        for key in ("seed", "speed", "volume", "takes"):
            if isinstance(params.get(key), bool) or not isinstance(params.get(key), int | float):
                params[key] = None
        for key in ("voice", "instruct", "format"):
            if not isinstance(params.get(key), str):
                params[key] = None
    return ItemSpec(name, params, problem)


def _as_text(value: Any, key: str) -> str | None:
    """A text field as text: strings, and numbers written as they are (a CSV cell, `"text": 42`)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise InputError(f"{key} must be text, got {type(value).__name__}")


def _as_name(value: Any) -> str | None:
    try:
        return _as_text(value, "name")
    except InputError:
        return None


LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _check(params: dict[str, Any], rules: BatchRules) -> None:
    text = params["text"]
    if not text:
        raise InputError("no text: give the words to speak")
    require_visible_text(text)
    if LONE_SURROGATE.search(text):  # JSON "\ud800": stored, it became U+FFFD and was read out as such
        raise InputError("the text holds a lone surrogate (not valid Unicode text): send it as UTF-8 text")
    if len(text) > rules.max_text_chars:
        raise InputError(f"text is {len(text)} characters, the limit is {rules.max_text_chars}: split it")
    if not has_content(text):
        raise InputError(f"the text {quoted(text)} has nothing to speak: give words to read")
    if not params.get("voice") and not rules.has_prompt:
        raise InputError("no voice: give a `voice` for the item or for the whole batch")
    params["seed"] = _number(params.get("seed"), "seed", int, 0, MAX_SEED)
    params["speed"] = _number(params.get("speed"), "speed", float, MIN_SPEED, MAX_SPEED)
    volume = _number(params.get("volume"), "volume", float, MIN_VOLUME, MAX_VOLUME)
    params["volume"] = 1.0 if volume is None else volume
    params["takes"] = _number(params.get("takes"), "takes", int, 1, MAX_TAKES)
    params["thresholds"] = checked_against(rules.thresholds, params.get("thresholds")) or None
    fmt = str(params.get("format") or "wav").lower()
    if fmt not in FORMATS:
        raise InputError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    params["format"] = fmt
    for key in ("voice", "instruct"):
        params[key] = str(params[key]).strip() or None if params.get(key) is not None else None


def _thresholds(value: Any) -> Any:
    """An item's `thresholds`: a JSON object, or its text (a CSV cell); empty: none."""
    if not isinstance(value, str):
        return value
    if not value.strip():
        return None
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        raise InputError(
            f'thresholds {value!r} is not a JSON object: write it as {{"min_similarity": 0.6}}'
        ) from None


def _number(value: Any, name: str, kind: type, low: float, high: float) -> Any:
    if value is None or value == "":
        return None
    try:
        if isinstance(value, bool):  # JSON true is no number (it read as 1)
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} {value!r} is not a number") from None
    if not math.isfinite(number) or not low <= number <= high or (kind is int and number != int(number)):
        what = "a whole number" if kind is int else "a number"
        raise InputError(f"{name} {value!r} is out of range: use {what} from {_shown(low)} to {_shown(high)}")
    return kind(number)


def _shown(bound: float) -> str:
    """A range's end as written: 2147483647, not 2.14748e+09."""
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def _file_name(name: Any, text: str, number: int) -> str:
    """A name that is safe in any file system and archive (letters, digits, `-`, `_`)."""
    cleaned = NAME_CHARS.sub("_", str(name if name not in (None, "") else text[:24])).strip("_")
    return cleaned[:MAX_NAME] or f"item{number}"
