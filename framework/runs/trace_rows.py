"""What every trace reader produces: one `TraceRow` per file row, the `WorkloadError` that names
the file and line of a bad one, the bounds a row must keep, and the stand-in tokenizer that maps
prompt text to ids."""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import NamedTuple

from schedlab.intake import MAX_PRIORITY
from schedlab.runs.distributions import (
    FIRST_TOKEN_ID,
    WorkloadError,
)

#: the most tokens a trace row's prompt or output may have: longer than any model's context
#: (the longest, Llama 4 Scout's, is 10M); a count beyond it is a corrupt row, and would
#: otherwise be drawn as that many random ids
MAX_TRACE_TOKENS = 10_000_000


class TraceRow(NamedTuple):
    """One usable-or-not row of a trace file, before arrival times are made relative."""

    arrival: float | None  # the file's timestamp (s), None where it has none
    prompt: list[int]
    output_len: int
    priority: int = 0
    client_id: str | None = None
    slo_class: str | None = None
    deadline_ms: float | None = None
    line: int = 0  # the file line it came from (the first line of a multi-line JSON value)


_PIECE = re.compile(r"\w{1,4}|[^\w\s]")


def text_to_token_ids(text: str, vocab_size: int) -> list[int]:
    """A deterministic stand-in tokenizer: pieces of up to 4 word characters or one symbol
    (about the length a BPE tokenizer gives English), each hashed into [2, vocab_size)."""
    span = vocab_size - FIRST_TOKEN_ID
    return [FIRST_TOKEN_ID + zlib.crc32(p.encode()) % span for p in _PIECE.findall(text)]


def row_error(path: Path, line: int, what: str) -> WorkloadError:
    """The error for a row that cannot be read: `<file> line <n>: <what>`."""
    return WorkloadError(f"{path.name} line {line}: {what}")


def token_count(n: int, path: Path, line: int, field: str) -> int:
    """`n`, a row's token count, checked against `MAX_TRACE_TOKENS`.

    Raises:
        WorkloadError: `n` is larger, naming the file, line and field.
    """
    if n > MAX_TRACE_TOKENS:
        raise row_error(path, line, f"{field}={n} is more than {MAX_TRACE_TOKENS:,} tokens, "
                                    "longer than any model's context")
    return n


def priority_value(p: int, path: Path, line: int) -> int:
    """`p`, a row's priority, checked against `MAX_PRIORITY`.

    Raises:
        WorkloadError: `|p|` is larger, naming the file and line.
    """
    if abs(p) > MAX_PRIORITY:
        shown = f"={p}" if abs(p) < 10**20 else f" of {len(str(abs(p)))} digits"
        raise row_error(path, line, f"priority{shown} is beyond +-2**53, the integers a float "
                                    "holds exactly (a priority queue ages it as one)")
    return p

