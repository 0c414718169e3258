"""Trace-file loaders: ShareGPT, Azure LLM inference traces, BurstGPT and plain JSONL.

Every loader returns `WorkloadRequest`s with arrival times relative to the earliest row (times
`time_scale`), or 0 where the file has no timestamps. Rows may name their tenant and SLO tier:
JSONL keys and CSV columns `client_id`, `priority`, `slo_class`, `deadline_ms` are read where
present. A ShareGPT file with `sessions: true` is replayed as multi-turn sessions
(`schedlab.runs.sessions`): each conversation one session, each human message a turn.
Prompts with a known length only get random token ids (seeded); text is mapped to ids by
`schedlab.runs.trace_rows.text_to_token_ids`. Rows that cannot run (0 prompt or 0 output
tokens, e.g. BurstGPT's failed requests) are skipped; rows that cannot be read raise
`WorkloadError` naming the file, the line and what is wrong. So do rows beyond the bounds of
`schedlab.runs.trace_rows`: a prompt or output over `MAX_TRACE_TOKENS` (10M) tokens, a
timestamp that is not finite or below 0, an arrival more than `MAX_TRACE_SECONDS` (1e9 s)
after the earliest, a `deadline_ms` that is not finite (CSV's 1e400 reads as inf), a
`priority` beyond `MAX_PRIORITY` (2**53).

This module checks the spec and makes arrival times relative; the per-format readers live in
`schedlab.runs.trace_json` (ShareGPT, JSONL) and `schedlab.runs.trace_csv` (Azure, BurstGPT).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from schedlab.runs.distributions import (
    MAX_TRACE_SECONDS,
    WorkloadError,
    WorkloadRequest,
    sample_lengths,
)
from schedlab.runs.trace_csv import CSV_COLUMNS, read_csv
from schedlab.runs.trace_json import read_jsonl, read_sharegpt, read_sharegpt_sessions
from schedlab.runs.trace_rows import TraceRow, row_error

FORMATS = ("sharegpt", "azure", "burstgpt", "jsonl")
#: format -> the field its arrival times come from (ShareGPT has none)
_TIME_FIELD = {"jsonl": "arrival_s", **{fmt: cols[0] for fmt, cols in CSV_COLUMNS.items()}}

#: the keys of a `type: trace` spec that `load_trace` reads (besides every type's own)
TRACE_KEYS = ("format", "path", "time_scale", "max_rows", "model", "sessions", "max_turns",
              "think_time_s")


def load_trace(spec: Mapping[str, Any], vocab_size: int,
               rng: np.random.Generator) -> list[WorkloadRequest]:
    """Read the trace a `type: trace` spec names.

    Args:
        spec: `path`, `format`, optional `time_scale` (multiplies inter-arrival times),
            `max_rows` (file rows to read), `num_requests` (keep the first N usable rows),
            `output_len` (replace the file's output lengths), `model` (BurstGPT: keep one
            model's rows), `sessions` (ShareGPT: each conversation a session, with
            `max_turns` and `think_time_s`). JSONL rows may carry an integer `priority`.
        vocab_size: the model's vocabulary.
        rng: draws random prompt ids.

    Raises:
        WorkloadError: a bad spec value, a missing file, a file that is not UTF-8, or a
            malformed or out-of-bounds row (naming its line).
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
    if (isinstance(scale, bool) or not isinstance(scale, int | float)
            or not 0 <= scale < math.inf):
        raise WorkloadError(f"workload.time_scale={scale!r} must be a finite number >= 0")
    max_rows = _limit(spec, "max_rows")
    num = _limit(spec, "num_requests")
    sessions = spec.get("sessions", False)
    if sessions is not None and not isinstance(sessions, bool):
        raise WorkloadError(f"workload.sessions={sessions!r}; accepted: true, false")
    try:
        if sessions:
            if fmt != "sharegpt":
                raise WorkloadError(f"workload.sessions=true needs format=sharegpt (got {fmt})")
            return read_sharegpt_sessions(path, spec, vocab_size, rng, max_rows, num,
                                          _limit(spec, "max_turns"))
        rows = _usable_rows(_read_rows(path, fmt, spec, vocab_size, rng), max_rows, num)
    except UnicodeDecodeError as e:
        raise WorkloadError(f"{path.name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not rows:
        raise WorkloadError(f"{path.name}: no usable rows (a row needs a prompt and output tokens)")
    out = [WorkloadRequest(row.prompt, row.output_len, priority=row.priority,
                           client_id=row.client_id, slo_class=row.slo_class,
                           deadline_ms=row.deadline_ms) for row in rows]
    t0, line0 = min(((row.arrival, row.line) for row in rows if row.arrival is not None),
                    default=(0.0, 0))
    for r, row in zip(out, rows, strict=True):
        if row.arrival is None:
            continue
        r.arrival_s = (row.arrival - t0) * float(scale)
        if not r.arrival_s <= MAX_TRACE_SECONDS:  # NOTE: also refuses inf and nan
            raise row_error(path, row.line, f"{_TIME_FIELD[fmt]}: {r.arrival_s:.4g} s after the "
                            f"earliest arrival (line {line0})"
                            + (f" at time_scale={scale}" if scale != 1 else "")
                            + f"; a trace spans at most {MAX_TRACE_SECONDS:.0e} s (~32 years)")
    if spec.get("output_len") is not None:
        lengths = sample_lengths(spec["output_len"], len(out), rng, "output_len")
        for r, k in zip(out, lengths, strict=True):
            r.max_tokens = int(k)
    return out


def _read_rows(path: Path, fmt: str, spec: Mapping[str, Any], vocab_size: int,
               rng: np.random.Generator) -> Iterator[TraceRow]:
    if fmt == "sharegpt":
        return read_sharegpt(path, vocab_size)
    if fmt == "jsonl":
        return read_jsonl(path, vocab_size, rng)
    return read_csv(path, fmt, vocab_size, rng, spec.get("model"))


def _usable_rows(rows: Iterator[TraceRow], max_rows: int | None,
                 num: int | None) -> list[TraceRow]:
    """The rows that can run (a prompt and output tokens) among the first `max_rows`, up to
    `num` of them."""
    out: list[TraceRow] = []
    for i, row in enumerate(rows):
        if max_rows is not None and i >= max_rows:
            break
        if not row.prompt or row.output_len <= 0:
            continue
        out.append(row)
        if num is not None and len(out) >= num:
            break
    return out


def _limit(spec: Mapping[str, Any], key: str) -> int | None:
    v = spec.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise WorkloadError(f"workload.{key}={v!r} must be a positive integer or null")
    return v
