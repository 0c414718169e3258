"""Trace-file loaders: ShareGPT, Azure LLM inference traces, BurstGPT and plain JSONL.

Every loader returns `WorkloadRequest`s with arrival times relative to the first row (times
`time_scale`), or 0 where the file has no timestamps. Rows may name their tenant and SLO tier:
JSONL keys and CSV columns `client_id`, `priority`, `slo_class`, `deadline_ms` are read where
present. A ShareGPT file with `sessions: true` is replayed as multi-turn sessions
(`schedlab.runs.sessions`): each conversation one session, each human message a turn.
Prompts with a known length only get random token ids (seeded); text is mapped to ids by
`text_to_token_ids`. Rows that cannot run (0 prompt or 0 output tokens, e.g. BurstGPT's failed
requests) are skipped; rows that cannot be read raise `WorkloadError` naming the file, the line
and what is wrong.
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
    sample_seconds,
)
from schedlab.runs.sessions import session_requests

FORMATS = ("sharegpt", "azure", "burstgpt", "jsonl")


class _Row(NamedTuple):
    arrival: float | None  # the file's timestamp (s), None where it has none
    prompt: list[int]
    output_len: int
    priority: int = 0
    client_id: str | None = None
    slo_class: str | None = None
    deadline_ms: float | None = None


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
    if spec.get("sessions"):
        if fmt != "sharegpt":
            raise WorkloadError(f"workload.sessions=true needs format=sharegpt (got {fmt})")
        return _sharegpt_sessions(path, spec, vocab_size, rng, max_rows, num)

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
        for i, row in enumerate(rows):
            if max_rows is not None and i >= max_rows:
                break
            if not row.prompt or row.output_len <= 0:
                continue
            out.append(WorkloadRequest(row.prompt, row.output_len, priority=row.priority,
                                       client_id=row.client_id, slo_class=row.slo_class,
                                       deadline_ms=row.deadline_ms))
            times.append(row.arrival)
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


def _sharegpt_sessions(path: Path, spec: Mapping[str, Any], vocab_size: int,
                       rng: np.random.Generator, max_rows: int | None,
                       num: int | None) -> list[WorkloadRequest]:
    """Each conversation a session: turn k's message is its k-th human message, its answer
    length the reply's; `max_turns` caps the turns, `num_requests` the sessions kept."""
    max_turns = _limit(spec, "max_turns")
    out: list[WorkloadRequest] = []
    num_sessions = 0
    for i, (line, entry) in enumerate(_json_records(path)):
        if (max_rows is not None and i >= max_rows) or (num is not None and num_sessions >= num):
            break
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(conv, list):
            raise _fail(path, line, "entry has no 'conversations' list")
        turns = []
        for k in range(0, len(conv) - 1, 2):
            pair = conv[k:k + 2]
            if not all(isinstance(m, dict) and isinstance(m.get("value"), str) for m in pair):
                raise _fail(path, line, "a turn in 'conversations' needs a string 'value'")
            msg = text_to_token_ids(pair[0]["value"], vocab_size)
            reply = len(text_to_token_ids(pair[1]["value"], vocab_size))
            if not msg or reply == 0:
                break  # the conversation cannot go on past an empty turn
            turns.append((msg, reply))
            if max_turns is not None and len(turns) >= max_turns:
                break
        if not turns:
            continue
        sid = str(entry.get("id", f"conv{i}"))
        if spec.get("output_len") is not None:
            lens = sample_lengths(spec["output_len"], len(turns), rng, "output_len")
            turns = [(m, int(k)) for (m, _), k in zip(turns, lens, strict=True)]
        thinks = sample_seconds(spec.get("think_time_s"), len(turns), rng, "think_time_s")
        out += session_requests(f"{sid}#{i}", [(m, k, float(t)) for (m, k), t
                                               in zip(turns, thinks, strict=True)])
        num_sessions += 1
    if not out:
        raise WorkloadError(f"{path.name}: no usable conversations (a turn needs a message "
                            "and a reply)")
    return out


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
        deadline = obj.get("deadline_ms")
        if deadline is not None and (isinstance(deadline, bool) or not isinstance(
                deadline, int | float) or not deadline > 0):
            raise _fail(path, line, f"deadline_ms={deadline!r} must be a positive number")
        client, tier = obj.get("client_id"), obj.get("slo_class")
        yield _Row(None if t is None else float(t), prompt, n_out, priority,
                   None if client is None else str(client), None if tier is None else str(tier),
                   None if deadline is None else float(deadline))


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
        extra = {k: header.index(k) for k in ("client_id", "priority", "slo_class",
                                              "deadline_ms") if k in header}
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
            yield _Row(t, random_tokens(rng, n_in, vocab_size), n_out,
                       *_tenant_columns(row, extra, path, line))


def _tenant_columns(row: list[str], extra: dict[str, int], path: Path,
                    line: int) -> tuple[int, str | None, str | None, float | None]:
    """(priority, client_id, slo_class, deadline_ms) from a CSV row's optional columns."""
    def cell(k: str) -> str | None:
        v = row[extra[k]].strip() if k in extra else ""
        return v or None

    prio, dl = cell("priority"), cell("deadline_ms")
    try:
        priority = 0 if prio is None else int(prio)
        deadline = None if dl is None else float(dl)
    except ValueError:
        raise _fail(path, line, f"priority={prio!r} / deadline_ms={dl!r}: not numbers") from None
    if deadline is not None and not deadline > 0:
        raise _fail(path, line, f"deadline_ms={dl!r} must be a positive number")
    return priority, cell("client_id"), cell("slo_class"), deadline


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
