"""Trace-file loaders: ShareGPT, Azure LLM inference traces, BurstGPT and plain JSONL.

Every loader returns `WorkloadRequest`s with arrival times relative to the first row (times
`time_scale`), or 0 where the file has no timestamps. Prompts with a known length only get
random token ids (seeded); text is mapped to ids by `text_to_token_ids`. Rows that cannot run
(0 prompt or 0 output tokens, e.g. BurstGPT's failed requests) are skipped; rows that cannot be
read raise `WorkloadError` naming the file, the line and what is wrong.
"""

from __future__ import annotations

import csv
import json
import math
import re
import zlib
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from schedlab.runs.distributions import (
    FIRST_TOKEN_ID,
    WorkloadError,
    WorkloadRequest,
    random_tokens,
    sample_lengths,
)

FORMATS = ("sharegpt", "azure", "burstgpt", "jsonl")


class _Row(NamedTuple):
    arrival: float | None  # the file's timestamp (s), None where it has none
    prompt: list[int]
    output_len: int
    priority: int = 0


_PIECE = re.compile(r"\w{1,4}|[^\w\s]")
_DATETIME = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{1,2}):(\d{2}):(\d{2}(?:\.\d+)?)")


def text_to_token_ids(text: str, vocab_size: int) -> list[int]:
    """A deterministic stand-in tokenizer: pieces of up to 4 word characters or one symbol
    (about the length a BPE tokenizer gives English), each hashed into [2, vocab_size)."""
    span = vocab_size - FIRST_TOKEN_ID
    return [FIRST_TOKEN_ID + zlib.crc32(p.encode()) % span for p in _PIECE.findall(text)]


def load_trace(spec: Mapping[str, Any], vocab_size: int,
               rng: np.random.Generator) -> list[WorkloadRequest]:
    """Read the trace a `type: trace` spec names.

    Args:
        spec: `path`, `format`, optional `time_scale` (multiplies inter-arrival times),
            `max_rows` (file rows to read), `num_requests` (keep the first N usable rows),
            `output_len` (replace the file's output lengths), `model` (BurstGPT: keep one
            model's rows). JSONL rows may carry an integer `priority`.
        vocab_size: the model's vocabulary.
        rng: draws random prompt ids.

    Raises:
        WorkloadError: a bad spec value, a missing file, or a malformed row.
    """
    fmt = spec.get("format")
    if fmt not in FORMATS:
        raise WorkloadError(f"workload.format={fmt!r}; accepted: {', '.join(FORMATS)}")
    if not spec.get("path"):
        raise WorkloadError("workload.path is required for type=trace (the trace file)")
    path = Path(str(spec["path"])).expanduser()
    if not path.is_file():
        raise WorkloadError(f"workload.path: trace file not found: {path}")
    scale = spec.get("time_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, int | float) or scale < 0:
        raise WorkloadError(f"workload.time_scale={scale!r} must be a number >= 0")
    max_rows = _limit(spec, "max_rows")
    num = _limit(spec, "num_requests")

    rows: Iterator[_Row]
    if fmt == "sharegpt":
        rows = _sharegpt(path, vocab_size)
    elif fmt == "jsonl":
        rows = _jsonl(path, vocab_size, rng)
    else:
        rows = _csv(path, fmt, vocab_size, rng, spec.get("model"))
    out: list[WorkloadRequest] = []
    times: list[float | None] = []
    try:
        for i, (t, prompt, n_out, priority) in enumerate(rows):
            if max_rows is not None and i >= max_rows:
                break
            if not prompt or n_out <= 0:
                continue
            out.append(WorkloadRequest(prompt, n_out, priority=priority))
            times.append(t)
            if num is not None and len(out) >= num:
                break
    except UnicodeDecodeError as e:
        raise WorkloadError(f"{path.name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not out:
        raise WorkloadError(f"{path.name}: no usable rows (a row needs a prompt and output tokens)")
    known = [t for t in times if t is not None]
    t0 = min(known, default=0.0)
    for r, t in zip(out, times, strict=True):
        r.arrival_s = 0.0 if t is None else (t - t0) * float(scale)
    if spec.get("output_len") is not None:
        lengths = sample_lengths(spec["output_len"], len(out), rng, "output_len")
        for r, k in zip(out, lengths, strict=True):
            r.max_tokens = int(k)
    return out


def _limit(spec: Mapping[str, Any], key: str) -> int | None:
    v = spec.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise WorkloadError(f"workload.{key}={v!r} must be a positive integer or null")
    return v


def _fail(path: Path, line: int, what: str) -> WorkloadError:
    return WorkloadError(f"{path.name} line {line}: {what}")


# ---- ShareGPT --------------------------------------------------------------------------
def _sharegpt(path: Path, vocab_size: int) -> Iterator[_Row]:
    for line, entry in _json_records(path):
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(conv, list):
            raise _fail(path, line, "entry has no 'conversations' list")
        if len(conv) < 2:
            continue  # a prompt without a reply: nothing to replay (vLLM skips these too)
        texts = []
        for turn in conv[:2]:
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                raise _fail(path, line, "a turn in 'conversations' needs a string 'value'")
            texts.append(turn["value"])
        reply = text_to_token_ids(texts[1], vocab_size)
        yield _Row(None, text_to_token_ids(texts[0], vocab_size), len(reply))


def _json_records(path: Path) -> Iterator[tuple[int, Any]]:
    """(line, value) for each element of a JSON array, or each line of a JSONL file."""
    text = path.read_text(encoding="utf-8-sig")
    stripped = text.lstrip()
    if not stripped.startswith("["):
        for n, raw in enumerate(text.splitlines(), 1):
            if raw.strip():
                try:
                    yield n, json.loads(raw)
                except json.JSONDecodeError as e:
                    raise _fail(path, n, f"invalid JSON: {e.msg} (column {e.colno})") from None
        return
    dec = json.JSONDecoder()
    pos = len(text) - len(stripped) + 1
    while True:
        pos = _skip_ws(text, pos)
        if pos < len(text) and text[pos] == "]":
            return
        line = text.count("\n", 0, pos) + 1
        try:
            value, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise _fail(path, e.lineno, f"invalid JSON: {e.msg} (column {e.colno})") from None
        yield line, value
        pos = _skip_ws(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos += 1
        elif pos >= len(text) or text[pos] != "]":
            at = text.count("\n", 0, pos) + 1
            raise _fail(path, at, "invalid JSON: expected ',' or ']' after an array element")


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


# ---- JSONL -----------------------------------------------------------------------------
def _jsonl(path: Path, vocab_size: int, rng: np.random.Generator) -> Iterator[_Row]:
    for line, obj in _json_records(path):
        if not isinstance(obj, dict):
            raise _fail(path, line, f"expected a JSON object, got {type(obj).__name__}")
        t = obj.get("arrival_s")
        if t is not None and (isinstance(t, bool) or not isinstance(t, int | float)
                              or not math.isfinite(t) or t < 0):
            raise _fail(path, line, f"arrival_s={t!r} must be a number >= 0")
        if "prompt_tokens" in obj:
            p = obj["prompt_tokens"]
            if isinstance(p, int) and not isinstance(p, bool) and p >= 0:
                prompt = random_tokens(rng, p, vocab_size)
            elif isinstance(p, list) and all(isinstance(x, int) and 0 <= x < vocab_size for x in p):
                prompt = list(p)
            else:
                raise _fail(path, line, "prompt_tokens must be a count >= 0 or a list of token "
                                        f"ids in [0, {vocab_size})")
        elif isinstance(obj.get("prompt"), str):
            prompt = text_to_token_ids(obj["prompt"], vocab_size)
        else:
            raise _fail(path, line, "needs 'prompt_tokens' (count or ids) or 'prompt' (text)")
        n_out = obj.get("output_tokens")
        if isinstance(n_out, bool) or not isinstance(n_out, int) or n_out < 0:
            raise _fail(path, line, f"output_tokens={n_out!r} must be an integer >= 0")
        priority = obj.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise _fail(path, line, f"priority={priority!r} must be an integer")
        yield _Row(None if t is None else float(t), prompt, n_out, priority)


# ---- CSV traces ------------------------------------------------------------------------
_COLUMNS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
}


def _csv(path: Path, fmt: str, vocab_size: int, rng: np.random.Generator,
         model: str | None) -> Iterator[_Row]:
    cols = _COLUMNS[fmt]
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in cols if c not in header]
        if missing:
            raise _fail(path, 1, f"missing column(s) {missing} for format={fmt}; found {header}")
        idx = [header.index(c) for c in cols]
        model_idx = header.index("Model") if "Model" in header else None
        for row in reader:
            line = reader.line_num
            if not any(c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise _fail(path, line, f"{len(row)} fields, the header has {len(header)}")
            if model is not None and model_idx is not None and row[model_idx].strip() != model:
                continue
            t = _timestamp(row[idx[0]], path, line, cols[0])
            n_in = _count(row[idx[1]], path, line, cols[1])
            n_out = _count(row[idx[2]], path, line, cols[2])
            yield _Row(t, random_tokens(rng, n_in, vocab_size), n_out)


def _count(value: str, path: Path, line: int, col: str) -> int:
    try:
        f = float(value)
    except ValueError:
        f = math.nan
    if not math.isfinite(f) or f < 0 or f != int(f):
        raise _fail(path, line, f"{col}={value!r} is not a token count (an integer >= 0)")
    return int(f)


def _timestamp(value: str, path: Path, line: int, col: str) -> float:
    value = value.strip()
    try:
        t = float(value)
        if math.isfinite(t):
            return t
    except ValueError:
        m = _DATETIME.match(value)
        if m is not None:
            day = datetime.fromisoformat(m.group(1)).toordinal() * 86400.0
            h, mi, s = int(m.group(2)), int(m.group(3)), float(m.group(4))
            return day + 3600 * h + 60 * mi + s
    raise _fail(path, line, f"{col}={value!r} is not a timestamp (seconds or "
                            "'YYYY-MM-DD HH:MM:SS.ffff')")
