"""Readers for the CSV trace formats: Azure LLM inference traces and BurstGPT.

Prompts have a known length only, so they get random token ids; optional columns
`client_id`, `priority`, `slo_class`, `deadline_ms` are read where present.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TextIO

import numpy as np

from schedlab.runs.distributions import random_tokens
from schedlab.runs.trace_rows import TraceRow, priority_value, row_error, token_count

#: format -> (timestamp, prompt tokens, output tokens) column names
CSV_COLUMNS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
}

_DATETIME = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{1,2}):(\d{2}):(\d{2}(?:\.\d+)?)")


def read_csv(path: Path, fmt: str, vocab_size: int, rng: np.random.Generator,
             model: str | None) -> Iterator[TraceRow]:
    """One row per CSV line of a `CSV_COLUMNS` format; `model` (BurstGPT) keeps one model's
    rows."""
    cols = CSV_COLUMNS[fmt]
    with path.open(newline="", encoding="utf-8-sig") as f:
        lines = _csv_lines(f, path)
        header = [h.strip() for h in next(lines, (1, []))[1]]
        missing = [c for c in cols if c not in header]
        if missing:
            raise row_error(path, 1,
                            f"missing column(s) {missing} for format={fmt}; found {header}")
        idx = [header.index(c) for c in cols]
        model_idx = header.index("Model") if "Model" in header else None
        extra: dict[str, int] = {k: header.index(k) for k in (
            "client_id", "priority", "slo_class", "deadline_ms") if k in header}
        for line, row in lines:
            if not any(c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise row_error(path, line, f"{len(row)} fields, the header has {len(header)}")
            if model is not None and model_idx is not None and row[model_idx].strip() != model:
                continue
            t = _timestamp(row[idx[0]], path, line, cols[0])
            n_in = _count(row[idx[1]], path, line, cols[1])
            n_out = _count(row[idx[2]], path, line, cols[2])
            yield TraceRow(t, random_tokens(rng, n_in, vocab_size), n_out,
                           *_tenant_columns(row, extra, path, line), line=line)


def _csv_lines(f: TextIO, path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line, fields) for each CSV record; a record `csv` cannot read (a field over its
    131,072-character limit, a NUL byte) raises `WorkloadError` naming its line.

    NOTE: the field limit stays: these traces hold numbers and short names, so a field that
    long is a corrupt or wrong file, not a prompt to keep.
    """
    reader = csv.reader(f)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise row_error(path, reader.line_num, f"not readable as CSV ({e})") from None
        yield reader.line_num, row


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
        raise row_error(path, line,
                        f"priority={prio!r} / deadline_ms={dl!r}: not numbers") from None
    if deadline is not None and not 0 < deadline < math.inf:  # NOTE: 1e400 reads as inf
        raise row_error(path, line, f"deadline_ms={dl!r} must be a finite positive number")
    return priority_value(priority, path, line), cell("client_id"), cell("slo_class"), deadline


def _count(value: str, path: Path, line: int, col: str) -> int:
    try:
        f = float(value)
    except ValueError:
        f = math.nan
    if not math.isfinite(f) or f < 0 or f != int(f):
        raise row_error(path, line, f"{col}={value!r} is not a token count (an integer >= 0)")
    return token_count(int(f), path, line, col)


def _timestamp(value: str, path: Path, line: int, col: str) -> float:
    value = value.strip()
    try:
        t = float(value)
        if math.isfinite(t) and t >= 0:
            return t
    except ValueError:
        m = _DATETIME.match(value)
        if m is not None:
            day = datetime.fromisoformat(m.group(1)).toordinal() * 86400.0
            h, mi, s = int(m.group(2)), int(m.group(3)), float(m.group(4))
            return day + 3600 * h + 60 * mi + s
    raise row_error(path, line, f"{col}={value!r} is not a timestamp (seconds >= 0 or "
                                "'YYYY-MM-DD HH:MM:SS.ffff')")
