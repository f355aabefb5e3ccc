"""The CosyVoice3 text tokenizer: Qwen2's byte-level BPE plus CosyVoice3's special tokens.

Built with the `tokenizers` library straight from `CosyVoice-BlankEN/{vocab.json,merges.txt,
tokenizer_config.json}` (no `transformers`). Ids match the official frontend exactly: Qwen2's own special
tokens keep their ids (`<|endoftext|>` 151643, `<|im_start|>` 151644, `<|im_end|>` 151645) and the
CosyVoice3 tokens that are new get the following ids in the order of `COSYVOICE3_SPECIAL_TOKENS`,
so `<|endofprompt|>` is 151646.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

from cosyserve.errors import ModelDirError

ENDOFTEXT = "<|endoftext|>"
ENDOFPROMPT = "<|endofprompt|>"

# Qwen2's pre-tokenizer split: contractions, letter runs (with one leading non-letter), single digits,
# punctuation runs, newlines and whitespace. Digits are split one by one, so numbers tokenize per digit.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_CMU_PHONES = (
    "AA AA0 AA1 AA2 AE AE0 AE1 AE2 AH AH0 AH1 AH2 AO AO0 AO1 AO2 AW AW0 AW1 AW2 AY AY0 AY1 AY2 B CH D DH "
    "EH EH0 EH1 EH2 ER ER0 ER1 ER2 EY EY0 EY1 EY2 F G HH IH IH0 IH1 IH2 IY IY0 IY1 IY2 JH K L M N NG "
    "OW OW0 OW1 OW2 OY OY0 OY1 OY2 P R S SH T TH UH UH0 UH1 UH2 UW UW0 UW1 UW2 V W Y Z ZH"
)
# Pinyin initials and toned finals, in the official order.
_PINYIN_UNITS = (
    "a ai an ang ao b c ch d e ei en eng f g h i ian in ing iu ià iàn iàng iào iá ián iáng iáo iè ié iòng "
    "ióng iù iú iā iān iāng iāo iē iě iōng iū iǎ iǎn iǎng iǎo iǒng iǔ j k l m n o ong ou p q r s sh t u "
    "uang ue un uo uà uài uàn uàng uá uái uán uáng uè ué uì uí uò uó uā uāi uān uāng uē uě uī uō uǎ uǎi "
    "uǎn uǎng uǐ uǒ vè w x y z zh à ài àn àng ào á ái án áng áo è èi èn èng èr é éi én éng ér ì ìn ìng "
    "í ín íng ò òng òu ó óng óu ù ùn ú ún ā āi ān āng āo ē ēi ēn ēng ě ěi ěn ěng ěr ī īn īng ō ōng ōu "
    "ū ūn ǎ ǎi ǎn ǎng ǎo ǐ ǐn ǐng ǒ ǒng ǒu ǔ ǔn ǘ ǚ ǜ"
)
# The official CosyVoice3 list of additional special tokens. Order matters: it decides the new ids.
COSYVOICE3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|im_start|>",
    "<|im_end|>",
    ENDOFPROMPT,
    "[breath]",
    "<strong>",
    "</strong>",
    "[noise]",
    "[laughter]",
    "[cough]",
    "[clucking]",
    "[accent]",
    "[quick_breath]",
    "<laughter>",
    "</laughter>",
    "[hissing]",
    "[sigh]",
    "[vocalized-noise]",
    "[lipsmack]",
    "[mn]",
    "<|endofsystem|>",
    *(f"[{phone}]" for phone in _CMU_PHONES.split()),
    *(f"[{unit}]" for unit in _PINYIN_UNITS.split()),
)


class TextTokenizer:
    """Text <-> token ids for the CosyVoice3 LLM. Build it with `TextTokenizer.from_dir(path)`."""

    def __init__(self, tokenizer: Tokenizer, special_tokens: tuple[str, ...]) -> None:
        self._tokenizer = tokenizer
        self._special_tokens = special_tokens

    @classmethod
    def from_dir(cls, path: str | Path) -> TextTokenizer:
        """Load from a `CosyVoice-BlankEN` directory (vocab.json + merges.txt + tokenizer_config.json).

        `path` may also be the model directory that contains `CosyVoice-BlankEN/`.
        """
        root = Path(path).expanduser()
        if not (root / "vocab.json").is_file() and (root / "CosyVoice-BlankEN" / "vocab.json").is_file():
            root = root / "CosyVoice-BlankEN"
        for name in ("vocab.json", "merges.txt"):
            if not (root / name).is_file():
                raise ModelDirError(
                    f"tokenizer file {root / name} is missing; pass the model's CosyVoice-BlankEN directory "
                    "or run `cosyserve download` to fetch the model again"
                )
        try:
            vocab: dict[str, int] = json.loads((root / "vocab.json").read_text(encoding="utf-8"))
            merges = _read_merges(root / "merges.txt")
            base_specials = _read_added_tokens(root / "tokenizer_config.json")
        except (OSError, ValueError) as exc:
            raise ModelDirError(
                f"tokenizer files in {root} cannot be read ({exc}); "
                "run `cosyserve download` to fetch them again"
            ) from exc
        return cls(_build(vocab, merges, base_specials), COSYVOICE3_SPECIAL_TOKENS)

    def encode(self, text: str) -> list[int]:
        """Token ids for `text`; a special token written in it (`<|endofprompt|>`, `[breath]`) is one id."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        """Text for `ids`; special tokens are dropped unless `skip_special_tokens` is False.

        Special tokens are written as they are, not through the byte-level decoder, which would garble
        the non-ASCII ones such as `[òng]`.
        """
        special = {i: token.content for i, token in self._tokenizer.get_added_tokens_decoder().items()}
        pieces: list[str] = []
        run: list[int] = []
        for token_id in ids:
            if token_id not in special:
                run.append(token_id)
                continue
            if run:
                pieces.append(self._tokenizer.decode(run, skip_special_tokens=False))
                run = []
            if not skip_special_tokens:
                pieces.append(special[token_id])
        if run:
            pieces.append(self._tokenizer.decode(run, skip_special_tokens=False))
        return "".join(pieces)

    @property
    def special_tokens(self) -> tuple[str, ...]:
        """The CosyVoice3 additional special tokens, in official order."""
        return self._special_tokens

    def token_to_id(self, token: str) -> int | None:
        """Id of one token string (a vocabulary entry or a special token), or None if unknown."""
        return self._tokenizer.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tokenizer.id_to_token(token_id)

    @property
    def endofprompt_id(self) -> int:
        """Id of `<|endofprompt|>`, which ends the prompt text in zero-shot and instruct modes."""
        return self._required_id(ENDOFPROMPT)

    @property
    def vocab_size(self) -> int:
        """Number of ids in use, special tokens included (the LLM's embedding table may be larger)."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def _required_id(self, token: str) -> int:
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:  # only reachable with a hand-built Tokenizer
            raise ModelDirError(f"the tokenizer has no {token} token; load it with TextTokenizer.from_dir")
        return token_id


def _read_merges(path: Path) -> list[tuple[str, str]]:
    merges = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise ValueError(f"merges.txt line {line!r} is not two space-separated symbols")
        merges.append((parts[0], parts[1]))
    return merges


def _read_added_tokens(path: Path) -> dict[int, str]:
    """Qwen2's own special tokens (`added_tokens_decoder`), id -> text; the Qwen2 defaults if absent."""
    if not path.is_file():
        return {151643: ENDOFTEXT, 151644: "<|im_start|>", 151645: "<|im_end|>"}
    config = json.loads(path.read_text(encoding="utf-8"))
    return {
        int(token_id): entry["content"] for token_id, entry in config.get("added_tokens_decoder", {}).items()
    }


def _build(vocab: dict[str, int], merges: list[tuple[str, str]], base_specials: dict[int, str]) -> Tokenizer:
    tokenizer = Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)

    # New tokens get ids after the highest id in use, so add Qwen2's specials first, in id order, and
    # check each landed where its config says. Special tokens match the raw text (not NFC-normalised).
    expected: dict[str, int] = {}
    next_id = max(vocab.values(), default=-1) + 1
    for token_id in sorted(base_specials):
        if token_id != next_id:
            raise ModelDirError(
                f"tokenizer_config.json gives {base_specials[token_id]} the id {token_id}, "
                f"but the next free id is {next_id}; the tokenizer files do not belong together: "
                "run `cosyserve download` again"
            )
        expected[base_specials[token_id]] = token_id
        next_id += 1
    for token in COSYVOICE3_SPECIAL_TOKENS:
        if token not in expected and token not in vocab:
            expected[token] = next_id
            next_id += 1
    ordered = [*(base_specials[i] for i in sorted(base_specials)), *COSYVOICE3_SPECIAL_TOKENS]
    tokenizer.add_special_tokens(
        [
            AddedToken(token, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
            for token in dict.fromkeys(ordered)
        ]
    )
    for token, token_id in expected.items():
        if tokenizer.token_to_id(token) != token_id:
            raise ModelDirError(
                f"special token {token} got id {tokenizer.token_to_id(token)} instead of {token_id}; "
                "the tokenizer files look modified: run `cosyserve download` again"
            )
    return tokenizer
