"""`cosyserve normalize TEXT`: show what the model will read: the spoken form, the sentence split, the tokens.

Only the model's tokenizer is needed (the English split counts tokens, and the tokens are shown), so it
runs without loading any network: `--model` names a model directory, a downloaded model id or `demo`.
Without `--model` it reads the default model's tokenizer when that model is downloaded, and otherwise
shows the text rules alone (the spoken form, the differences and an estimated sentence split): the LM's
token ids need a tokenizer, which it says.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from pathlib import Path

from cosyserve.commands.text_files import read_text_file
from cosyserve.errors import InputError, ModelDirError

NO_TOKENIZER_NOTE = (
    "the LM's tokens need a model's tokenizer: pass --model DIR (or --model demo), or run "
    "`cosyserve download`; without one the English sentence split is estimated from word counts"
)


class WordCountEncoder:
    """Stands in for the tokenizer where none is downloaded: one id per word or punctuation mark, about
    what the real tokenizer gives for English (the only language whose split counts tokens)."""

    def encode(self, text: str) -> list[int]:
        return [0] * len(re.findall(r"\w+|[^\w\s]", text))

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        del ids, skip_special_tokens
        return ""  # the pieces are dropped with the rest of the stand-in's tokens


def default_tokenizer():
    """The default model's tokenizer when that model is downloaded, else None (no network is tried)."""
    from cosyserve.frontend.tokenizer import TextTokenizer
    from cosyserve.modeldir.resolve import resolve_model

    try:
        return TextTokenizer.from_dir(resolve_model(None, download=False).tokenizer_dir)
    except ModelDirError:
        return None


def load_tokenizer(spec: str | None):
    """The text tokenizer of a model directory (or of its `CosyVoice-BlankEN/`), a downloaded id or `demo`;
    with no `spec`, the default model's if it is downloaded, else None."""
    from cosyserve.frontend.tokenizer import TextTokenizer
    from cosyserve.modeldir.model_dir import TOKENIZER_DIR
    from cosyserve.modeldir.resolve import resolve_model

    if not spec:
        return default_tokenizer()
    path = Path(spec).expanduser()
    if path.is_dir():
        for candidate in (path / TOKENIZER_DIR, path):
            if (candidate / "vocab.json").is_file():
                return TextTokenizer.from_dir(candidate)
        raise InputError(
            f"{path} holds no tokenizer (vocab.json, or {TOKENIZER_DIR}/vocab.json): pass a model dir"
        )
    return TextTokenizer.from_dir(resolve_model(spec, download=False).tokenizer_dir)


def _read_text(args: argparse.Namespace) -> str:
    if (args.text is None) == (args.text_file is None):
        raise InputError("give the text to read, or --text-file FILE (not both)")
    if args.text_file is None:
        return args.text
    return read_text_file(args.text_file)


def render(description) -> str:
    """The description as aligned text lines (see `frontend.text.describe.TextDescription`)."""
    lines = [f"language     {description.language}", f"typed        {description.typed.strip()}"]
    lines.append(f"spoken       {description.spoken}")
    if description.official != description.spoken:
        lines.append(f"official     {description.official}")
    for index, correction in enumerate(description.corrections):
        how = "  (rewritten for wetext)" if correction.rewritten else ""
        label = "differences" if index == 0 else ""
        lines.append(f"{label:<12} {correction.rule}: {correction.written} -> {correction.reading}{how}")
    mode = description.mode + (f" ({description.instruction})" if description.instruction else "")
    lines.append(f"mode         {mode}")
    for index, segment in enumerate(description.segments, 1):
        lines.append(f"{'sentences' if index == 1 else '':<12} {index}. {segment}")
    if description.prompt is not None:
        lines.append(f"LM prompt    {description.prompt.text}  ({len(description.prompt.token_ids)} tokens)")
    for index, lm_input in enumerate(description.lm_inputs, 1):
        label = "LM reads" if index == 1 else ""
        lines.append(f"{label:<12} {index}. {lm_input.text}  ({len(lm_input.token_ids)} tokens)")
        lines.append(f"{'':<15}{'|'.join(lm_input.pieces)}")
    lines.extend(f"warning      {warning}" for warning in description.warnings)
    return "\n".join(lines)


def cmd_normalize(args: argparse.Namespace) -> int:
    text = _read_text(args)
    tokenizer = load_tokenizer(args.model)
    from cosyserve.frontend.text.describe import describe_text

    description = describe_text(
        text,
        tokenizer if tokenizer is not None else WordCountEncoder(),  # type: ignore[arg-type]
        prompt_text=args.prompt_text,
        instruct=args.instruct,
        max_chars=None,
    )
    if tokenizer is None:  # the stand-in's "tokens" are not the LM's: show none
        description = dataclasses.replace(description, prompt=None, lm_inputs=())
    if args.json:
        data = dataclasses.asdict(description)
        data["tokenizer"] = None if tokenizer is None else "model"
        print(json.dumps(data, ensure_ascii=False, indent=2))
    else:
        print(render(description))
    if tokenizer is None:
        print(f"note: {NO_TOKENIZER_NOTE}", file=sys.stderr)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "normalize", help="show how a text is read: spoken form, sentence split and the LM's tokens"
    )
    parser.add_argument("text", nargs="?", default=None, help="the text (or use --text-file)")
    parser.add_argument("--text-file", default=None, help="read the text from this UTF-8 file")
    parser.add_argument(
        "--model",
        default=os.environ.get("COSYSERVE_MODEL"),
        help="model directory, downloaded model id or 'demo' (only its tokenizer is read; default: the "
        "default model's if downloaded, else the text rules alone)",
    )
    parser.add_argument("--prompt-text", default=None, help="transcript of the prompt audio (zero-shot mode)")
    parser.add_argument("--instruct", default=None, help="an instruction or preset (instruct mode)")
    parser.add_argument("--json", action="store_true", help="print the description as JSON")
    parser.set_defaults(func=cmd_normalize)
