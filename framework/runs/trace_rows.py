"""What every trace reader produces: one `TraceRow` per file row, the `WorkloadError` that names
the file and line of a bad one, and the stand-in tokenizer that maps prompt text to ids."""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import NamedTuple

from schedlab.runs.distributions import FIRST_TOKEN_ID, WorkloadError


class TraceRow(NamedTuple):
    """One usable-or-not row of a trace file, before arrival times are made relative."""

    arrival: float | None  # the file's timestamp (s), None where it has none
    prompt: list[int]
    output_len: int
    priority: int = 0
    client_id: str | None = None
    slo_class: str | None = None
    deadline_ms: float | None = None


_PIECE = re.compile(r"\w{1,4}|[^\w\s]")


def text_to_token_ids(text: str, vocab_size: int) -> list[int]:
    """A deterministic stand-in tokenizer: pieces of up to 4 word characters or one symbol
    (about the length a BPE tokenizer gives English), each hashed into [2, vocab_size)."""
    span = vocab_size - FIRST_TOKEN_ID
    return [FIRST_TOKEN_ID + zlib.crc32(p.encode()) % span for p in _PIECE.findall(text)]


def row_error(path: Path, line: int, what: str) -> WorkloadError:
    """The error for a row that cannot be read: `<file> line <n>: <what>`."""
    return WorkloadError(f"{path.name} line {line}: {what}")
