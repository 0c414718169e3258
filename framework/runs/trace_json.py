"""Readers for the JSON trace formats: ShareGPT (one request per conversation, or each
conversation a multi-turn session) and plain JSONL (one request per object)."""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from schedlab.runs.distributions import (
    WorkloadError,
    WorkloadRequest,
    random_tokens,
    sample_lengths,
    sample_seconds,
)
from schedlab.runs.sessions import session_requests
from schedlab.runs.trace_rows import (
    TraceRow,
    priority_value,
    row_error,
    text_to_token_ids,
    token_count,
)


# ---- ShareGPT --------------------------------------------------------------------------
def read_sharegpt(path: Path, vocab_size: int) -> Iterator[TraceRow]:
    """One row per conversation: its first message the prompt, its reply's length the output."""
    for line, entry in json_records(path):
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(conv, list):
            raise row_error(path, line, "entry has no 'conversations' list")
        if len(conv) < 2:
            continue  # a prompt without a reply: nothing to replay (vLLM skips these too)
        texts = []
        for turn in conv[:2]:
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                raise row_error(path, line, "a turn in 'conversations' needs a string 'value'")
            texts.append(turn["value"])
        reply = text_to_token_ids(texts[1], vocab_size)
        yield TraceRow(None, text_to_token_ids(texts[0], vocab_size), len(reply), line=line)


def read_sharegpt_sessions(path: Path, spec: Mapping[str, Any], vocab_size: int,
                           rng: np.random.Generator, max_rows: int | None, num: int | None,
                           max_turns: int | None) -> list[WorkloadRequest]:
    """Each conversation a session: turn k's message is its k-th human message, its answer
    length the reply's; `max_turns` caps the turns, `num` the sessions kept."""
    out: list[WorkloadRequest] = []
    num_sessions = 0
    for i, (line, entry) in enumerate(json_records(path)):
        if (max_rows is not None and i >= max_rows) or (num is not None and num_sessions >= num):
            break
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(conv, list):
            raise row_error(path, line, "entry has no 'conversations' list")
        turns = []
        for k in range(0, len(conv) - 1, 2):
            pair = conv[k:k + 2]
            if not all(isinstance(m, dict) and isinstance(m.get("value"), str) for m in pair):
                raise row_error(path, line, "a turn in 'conversations' needs a string 'value'")
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


def json_records(path: Path) -> Iterator[tuple[int, Any]]:
    """(line, value) for each element of a JSON array, or each line of a JSONL file.

    Raises:
        WorkloadError: a value that is not JSON, nested too deeply for the parser, or holds
            an integer too long for Python to read, naming its line.
        UnicodeDecodeError: the file is not UTF-8 (`load_trace` words it).
    """
    text = path.read_text(encoding="utf-8-sig")
    stripped = text.lstrip()
    if not stripped.startswith("["):
        for n, raw in enumerate(text.splitlines(), 1):
            if raw.strip():
                try:
                    value = json.loads(raw)
                except json.JSONDecodeError as e:
                    raise row_error(path, n, f"invalid JSON: {e.msg} (column {e.colno})") from None
                except (RecursionError, ValueError) as e:
                    raise row_error(path, n, _unreadable(e)) from None
                yield n, value
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
            raise row_error(path, e.lineno, f"invalid JSON: {e.msg} (column {e.colno})") from None
        except (RecursionError, ValueError) as e:
            raise row_error(path, line, _unreadable(e)) from None
        yield line, value
        pos = _skip_ws(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos += 1
        elif pos >= len(text) or text[pos] != "]":
            at = text.count("\n", 0, pos) + 1
            raise row_error(path, at, "invalid JSON: expected ',' or ']' after an array element")


def _unreadable(e: RecursionError | ValueError) -> str:
    """Why a value that is valid JSON cannot be read: nested deeper than Python's parser goes,
    or an integer over its 4300-digit limit."""
    if isinstance(e, RecursionError):
        return "invalid JSON: nested too deeply to read"
    return f"invalid JSON: {str(e).split(':')[0]}"


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


# ---- JSONL -----------------------------------------------------------------------------
#: the fields `read_jsonl` reads (another is left out, but one spelt like these is refused,
#: naming the line)
JSONL_KEYS = ("prompt_tokens", "prompt", "output_tokens", "arrival_s", "priority", "client_id",
              "slo_class", "deadline_ms")


def read_jsonl(path: Path, vocab_size: int, rng: np.random.Generator) -> Iterator[TraceRow]:
    """One row per JSON object: `prompt_tokens` (a count or ids) or `prompt` (text),
    `output_tokens`, and optional `arrival_s`, `priority`, `client_id`, `slo_class`,
    `deadline_ms`."""
    for line, obj in json_records(path):
        if not isinstance(obj, dict):
            raise row_error(path, line, f"expected a JSON object, got {type(obj).__name__}")
        for k in obj:  # NOTE: a misspelt field ("priorty") would run without it
            if k not in JSONL_KEYS and (near := difflib.get_close_matches(k, JSONL_KEYS, 1, 0.8)):
                raise row_error(path, line, f"{k!r} is not a field of a JSONL trace row (did "
                                            f"you mean {near[0]!r}?); fields: "
                                            f"{', '.join(JSONL_KEYS)}; others ('id', 'note', "
                                            "...) are kept out of the run")
        t = obj.get("arrival_s")
        arrival = None if t is None else _finite(t)
        if t is not None and (arrival is None or arrival < 0):
            raise row_error(path, line, f"arrival_s={t!r} must be a finite number >= 0")
        if "prompt_tokens" in obj:
            p = obj["prompt_tokens"]
            if isinstance(p, int) and not isinstance(p, bool) and p >= 0:
                prompt = random_tokens(rng, token_count(p, path, line, "prompt_tokens"),
                                       vocab_size)
            elif isinstance(p, list) and all(isinstance(x, int) and 0 <= x < vocab_size for x in p):
                prompt = list(p)
            else:
                raise row_error(path, line, "prompt_tokens must be a count >= 0 or a list of "
                                            f"token ids in [0, {vocab_size})")
        elif isinstance(obj.get("prompt"), str):
            prompt = text_to_token_ids(obj["prompt"], vocab_size)
        else:
            raise row_error(path, line, "needs 'prompt_tokens' (count or ids) or 'prompt' (text)")
        n_out = obj.get("output_tokens")
        if isinstance(n_out, bool) or not isinstance(n_out, int) or n_out < 0:
            raise row_error(path, line, f"output_tokens={n_out!r} must be an integer >= 0")
        token_count(n_out, path, line, "output_tokens")
        priority = obj.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise row_error(path, line, f"priority={priority!r} must be an integer")
        priority_value(priority, path, line)
        dl = obj.get("deadline_ms")
        deadline = None if dl is None else _finite(dl)
        if dl is not None and (deadline is None or not deadline > 0):
            raise row_error(path, line, f"deadline_ms={dl!r} must be a finite positive number")
        client, tier = obj.get("client_id"), obj.get("slo_class")
        yield TraceRow(arrival, prompt, n_out, priority,
                       None if client is None else str(client), None if tier is None else str(tier),
                       deadline, line=line)


def _finite(v: Any) -> float | None:
    """`v` as a float if it is a finite JSON number (an int too large for a float is not)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None
