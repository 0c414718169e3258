"""Tokenizers: a checkpoint directory's own, and the built-in tiny one (for models without one,
such as the simulated presets). The offline API, the server and the simulated executor load
them here."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

#: a directory holds a tokenizer when it has one of these
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
#: the built-in tokenizer's directory under the cache (bumped when its files change)
TINY_TOKENIZER = "tokenizer-tiny-v1"


def has_tokenizer(path: str | Path) -> bool:
    """Whether `path` is a directory with tokenizer files. No state change."""
    p = Path(path)
    return any((p / f).is_file() for f in TOKENIZER_FILES)


def load_tokenizer(path: str | Path) -> Any:
    """The Hugging Face tokenizer saved in `path`, or None when it has none (a preset name)."""
    if not has_tokenizer(path):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(Path(path))


def tiny_tokenizer_dir() -> Path:
    """The built-in tiny tokenizer (the one tiny checkpoints ship, chat template included),
    saved under the cache on first use; its directory."""
    from schedlab.tiny import build_tokenizer, cache_dir

    out = cache_dir() / TINY_TOKENIZER
    if has_tokenizer(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    build_tokenizer().save_pretrained(tmp)
    try:
        os.rename(tmp, out)
    except OSError:  # another process got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def visible_token_ids(path: str | Path | None, vocab_size: int, avoid: set[int],
                      num: int = 8) -> list[int]:
    """Up to `num` token ids of the tokenizer in `path` (None: the built-in tiny one) that each
    decode to a visible word after a space and, in any order and number, re-tokenize 1:1 (one
    word, one token).

    Reads only `tokenizer.json` (the `tokenizers` library; no transformers). Empty when the
    tokenizer has no such tokens below `vocab_size` outside `avoid`.
    """
    from tokenizers import Tokenizer

    if path is None:
        from schedlab.tiny import train_tokenizer

        tok = train_tokenizer()
    else:
        f = Path(path) / "tokenizer.json"
        if not f.is_file():
            return []
        tok = Tokenizer.from_file(str(f))
    special = set(tok.get_added_tokens_decoder())
    found: list[int] = []
    for t in range(min(tok.get_vocab_size(), vocab_size)):
        if t in avoid or t in special:
            continue
        text = tok.decode([t])
        word = text[1:]
        if not (text.startswith(" ") and len(word) >= 2 and word.isalpha()):
            continue
        if tok.encode(text, add_special_tokens=False).ids != [t]:
            continue
        trial = [*found, t, *found, t]
        if tok.encode(tok.decode(trial), add_special_tokens=False).ids == trial:
            found.append(t)
            if len(found) == num:
                break
    return found
