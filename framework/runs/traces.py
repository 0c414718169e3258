"""Trace-file loaders: ShareGPT, Azure LLM inference traces, BurstGPT and plain JSONL.

Every loader returns `WorkloadRequest`s with arrival times relative to the first row (times
`time_scale`), or 0 where the file has no timestamps. Rows may name their tenant and SLO tier:
JSONL keys and CSV columns `client_id`, `priority`, `slo_class`, `deadline_ms` are read where
present. A ShareGPT file with `sessions: true` is replayed as multi-turn sessions
(`schedlab.runs.sessions`): each conversation one session, each human message a turn.
Prompts with a known length only get random token ids (seeded); text is mapped to ids by
`schedlab.runs.trace_rows.text_to_token_ids`. Rows that cannot run (0 prompt or 0 output
tokens, e.g. BurstGPT's failed requests) are skipped; rows that cannot be read raise
`WorkloadError` naming the file, the line and what is wrong.

This module checks the spec and makes arrival times relative; the per-format readers live in
`schedlab.runs.trace_json` (ShareGPT, JSONL) and `schedlab.runs.trace_csv` (Azure, BurstGPT).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from schedlab.runs.distributions import WorkloadError, WorkloadRequest, sample_lengths
from schedlab.runs.trace_csv import read_csv
from schedlab.runs.trace_json import read_jsonl, read_sharegpt, read_sharegpt_sessions
from schedlab.runs.trace_rows import TraceRow

FORMATS = ("sharegpt", "azure", "burstgpt", "jsonl")
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
    sessions = spec.get("sessions", False)
    if sessions is not None and not isinstance(sessions, bool):
        raise WorkloadError(f"workload.sessions={sessions!r}; accepted: true, false")
    if sessions:
        if fmt != "sharegpt":
            raise WorkloadError(f"workload.sessions=true needs format=sharegpt (got {fmt})")
        return read_sharegpt_sessions(path, spec, vocab_size, rng, max_rows, num,
                                      _limit(spec, "max_turns"))

    rows: Iterator[TraceRow]
    if fmt == "sharegpt":
        rows = read_sharegpt(path, vocab_size)
    elif fmt == "jsonl":
        rows = read_jsonl(path, vocab_size, rng)
    else:
        rows = read_csv(path, fmt, vocab_size, rng, spec.get("model"))
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
