"""The byte-level BPE tokenizer files of the demo model (`CosyVoice-BlankEN/`).

256 byte-level characters in Qwen2 order, a few merges learned from a small built-in sample, then
filler entries up to id 151642 so that Qwen2's special tokens keep their ids (151643..151645) and the
CosyVoice3 special tokens follow them exactly as in the real model.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping

from cosyserve.frontend.tokenizer import ENDOFTEXT, QWEN2_SPLIT_PATTERN

QWEN2_VOCAB_SIZE = 151936  # rows of embed_tokens: Qwen2's padded vocabulary
FIRST_SPECIAL_ID = 151643  # <|endoftext|>; the BPE vocabulary fills every id below it
QWEN2_SPECIALS = (ENDOFTEXT, "<|im_start|>", "<|im_end|>")
MAX_MERGES = 400

# The demo LLM's Qwen2 sizes (also read by demo_model through config.json).
LLM_SIZES = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128}

# Text the BPE merges are learned from (Chinese, English, Japanese kana); written for this file.
_MERGE_SAMPLE = """\
You are a helpful assistant. 你好，世界。希望你以后能够做的比我还好呦。
The weather is nice today, so we are going to the park in the afternoon.
今天天气很好，我们下午去公园散步吧。这是一个用于测试的随机模型，它的声音只是噪声。
こんにちは、せかい。きょう は いい てんき です ね。コンニチハ、セカイ。テスト デス。
Please read this sentence slowly and clearly. This is a test of the speech system.
我们的服务可以在本地运行，也可以在云端服务器上运行。谢谢大家的支持！
ありがとう ございます。また あした。アリガトウ ゴザイマス。マタ アシタ。
"""


def _byte_alphabet() -> list[str]:
    """The byte-level BPE character for each byte value: printable Latin-1 as itself, others from U+0100."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = iter(range(0x100, 0x200))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


def tokenizer_files(sizes: Mapping[str, int] = LLM_SIZES) -> dict[str, str]:
    alphabet = _byte_alphabet()
    printable_first = sorted(range(256), key=lambda b: (ord(alphabet[b]) >= 0x100, b))
    vocab = {alphabet[b]: i for i, b in enumerate(printable_first)}
    merges = _learn_merges(_MERGE_SAMPLE, MAX_MERGES)
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    for filler in range(len(vocab), FIRST_SPECIAL_ID):
        vocab[f"<|filler_{filler}|>"] = filler
    added = {
        str(FIRST_SPECIAL_ID + i): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, token in enumerate(QWEN2_SPECIALS)
    }
    tokenizer_config = {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": list(QWEN2_SPECIALS[1:]),
        "bos_token": None,
        "eos_token": ENDOFTEXT,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 32768,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
    }
    return {
        "config.json": _dump(_qwen2_config(sizes)),
        "vocab.json": json.dumps(vocab, ensure_ascii=False),
        "merges.txt": "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
        "tokenizer_config.json": _dump(tokenizer_config),
    }


def _learn_merges(text: str, limit: int) -> list[tuple[str, str]]:
    """Greedy BPE: merge the most frequent adjacent pair (ties: the smallest) while it occurs twice."""
    from tokenizers import Regex, pre_tokenizers

    splitter = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    counts: dict[tuple[str, ...], int] = {}
    for piece, _ in splitter.pre_tokenize_str(text):
        counts[tuple(piece)] = counts.get(tuple(piece), 0) + 1
    merges: list[tuple[str, str]] = []
    while len(merges) < limit:
        pairs: dict[tuple[str, str], int] = {}
        for word, count in counts.items():
            for pair in itertools.pairwise(word):
                pairs[pair] = pairs.get(pair, 0) + count
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        if pairs[best] < 2:
            break
        merges.append(best)
        counts = {_merge_word(word, best): count for word, count in counts.items()}
    return merges


def _merge_word(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    merged: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            merged.append(word[i] + word[i + 1])
            i += 2
        else:
            merged.append(word[i])
            i += 1
    return tuple(merged)


def _qwen2_config(sizes: Mapping[str, int]) -> dict[str, object]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": FIRST_SPECIAL_ID,
        "eos_token_id": FIRST_SPECIAL_ID,
        "hidden_act": "silu",
        "hidden_size": sizes["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": sizes["intermediate"],
        "max_position_embeddings": 32768,
        "max_window_layers": sizes["layers"],
        "model_type": "qwen2",
        "num_attention_heads": sizes["heads"],
        "num_hidden_layers": sizes["layers"],
        "num_key_value_heads": sizes["kv_heads"],
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": QWEN2_VOCAB_SIZE,
    }


def _dump(data: object) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
