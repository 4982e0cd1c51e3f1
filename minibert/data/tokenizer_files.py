"""A tokenizer's files in transformers' layout, beside minibert's `tokenizer.json`.

`vocab.txt` (a token per line, its id the line number) and `tokenizer_config.json` (the
casing, and the model's length), as hub checkpoints carry them and AutoTokenizer reads them:
read here, refusing by name what would give other ids, and the config written for a BERT
normaliser.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from .text import iter_lines
from ..paths import file_present
from .special_tokens import CLS, MASK, PAD, SEP, UNK


# The tokenizer_config.json keys that decide the normalizer: true, false or null (default).
CONFIG_FLAGS = ("do_lower_case", "strip_accents", "tokenize_chinese_chars")

# transformers' `model_max_length` when no model length is known (its VERY_LARGE_INTEGER),
# and the bound above which it reads a length as unknown (its LARGE_INTEGER): a folder
# transformers saved for a tokenizer of no model records 1e30 there.
NO_MAX_LENGTH = int(1e30)
UNKNOWN_ABOVE = int(1e20)


def checked_max_length(value: object, name: str = "model_max_length") -> Optional[int]:
    """A model length as `Tokenizer.model_max_length` keeps it: an int >= 1, or None for
    "unknown" (None, or transformers' huge stand-ins for it); anything else refused by name."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be an integer >= 1, the longest input in "
                         f"tokens (a BERT's max_position_embeddings)")
    return None if value > UNKNOWN_ABOVE else value


def read_tokenizer_config(path: Path) -> dict:
    """The keys of `CONFIG_FLAGS` and `model_max_length` (None: unknown) in a transformers
    `tokenizer_config.json` ({} if there is no such file), each checked: a string "false"
    would otherwise reach the Rust normalizer as a TypeError far from the file that holds it."""
    if not file_present(path):  # a link to nothing raises: passed over, it gives the default casing
        return {}
    fix = "repair it or re-save the tokenizer (Tokenizer.save writes this file)"
    try:
        config = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 ({e}); {fix}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); {fix}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object, not a {_json_type(config)}; {fix}")
    for key in CONFIG_FLAGS:
        value = config.get(key)
        if value is not None and not isinstance(value, bool):
            raise ValueError(
                f"{path}: \"{key}\" is {value!r} (a {_json_type(value)}); booleans must be "
                f"JSON true or false (or null for the default); {fix}")
    try:
        length = checked_max_length(config.get("model_max_length"), '"model_max_length"')
    except ValueError as e:
        raise ValueError(f"{path}: {e}; {fix}") from None
    return {**{key: config.get(key) for key in CONFIG_FLAGS}, "model_max_length": length}


def _json_type(value: object) -> str:
    """The JSON name of a parsed value's type, for error messages."""
    if isinstance(value, (int, float)):
        return "boolean" if isinstance(value, bool) else "number"
    return {str: "string", list: "list", dict: "object"}.get(type(value), "null")


def read_vocab_txt(path: Path) -> dict[str, int]:
    """A BERT `vocab.txt`: one token per line, the id is the line number (from 0). A token
    listed twice has no single id, so it is refused rather than guessed at."""
    lines: dict[str, list[int]] = {}
    for i, line in enumerate(iter_lines(path)):
        token = (line.removeprefix("\ufeff") if i == 0 else line).strip()
        lines.setdefault(token, []).append(i)
    repeated = [(t, ids) for t, ids in lines.items() if len(ids) > 1]
    if repeated:
        shown = "; ".join(
            f"{t!r} on lines {', '.join(str(i + 1) for i in ids[:-1])} and {ids[-1] + 1}"
            for t, ids in repeated[:5])
        more = f" (and {len(repeated) - 5} more)" if len(repeated) > 5 else ""
        raise ValueError(
            f"{path} lists a token more than once: {shown}{more}. A token's id is its line "
            f"number, so a repeated token has no single id. If the file belongs to a trained "
            f"model, replace the earlier line(s) with an unused placeholder such as "
            f"[unused99] so that no other id moves (transformers maps the token to its last "
            f"line); otherwise delete the extra line(s).")
    return {t: ids[0] for t, ids in lines.items()}


def tokenizer_config_for(normalizer: Optional[dict], model_max_length: Optional[int]
                         ) -> Optional[dict]:
    """transformers' `tokenizer_config.json` for a BertTokenizer with this normaliser (its
    entry in tokenizer.json), or None when the normaliser is not BERT's."""
    if not normalizer or normalizer.get("type") != "BertNormalizer":
        return None
    config = {"tokenizer_class": "BertTokenizer",
              "do_lower_case": normalizer["lowercase"],
              "strip_accents": normalizer.get("strip_accents"),  # None: as do_lower_case
              "tokenize_chinese_chars": normalizer.get("handle_chinese_chars", True),
              "unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS,
              "mask_token": MASK}
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    return config
