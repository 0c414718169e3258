"""Multi-turn sessions: conversations whose next turn arrives after the previous answer.

A session is a list of `WorkloadRequest`s sharing a `session_id`, with `turn` 0, 1, ... Turn 0
arrives at the session's `arrival_s`; a later turn holds only its new message and is released by
the run loop (`schedlab.cluster.loop`) `think_time_s` after the previous turn finished, its prompt
being the previous prompt + the previous answer + the new message. Prefix caches thus see each
conversation's history again, and session-affine routing has something to keep together.

`type: sessions` builds synthetic conversations; a ShareGPT trace with `sessions: true` replays
its conversations (`schedlab.runs.traces`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from schedlab.runs.distributions import (
    WorkloadError,
    WorkloadRequest,
    get_int,
    random_tokens,
    sample_lengths,
    sample_seconds,
)

#: the keys of a `type: sessions` spec that `build_sessions` reads (besides every type's own)
SESSION_KEYS = ("num_sessions", "turns", "first_input_len", "input_len", "think_time_s")

def build_sessions(spec: Mapping[str, Any], vocab_size: int,
                   rng: np.random.Generator) -> list[WorkloadRequest]:
    """Synthetic conversations (arrivals unset: all sessions start at 0).

    Args:
        spec: `num_sessions`, `turns` (a length spec: turns per session), `input_len` (tokens
            of each new user message), `first_input_len` (turn 0's message, e.g. a system
            prompt plus question; default `input_len`), `output_len` (answer tokens per turn),
            `think_time_s` (seconds between an answer and the next message: a number or
            `{dist: fixed | uniform | exponential, ...}`), `num_requests` (null, or keep only
            the first N turns, session by session).
        vocab_size: the model's vocabulary.
        rng: seeds every draw.

    Raises:
        WorkloadError: a missing or bad key.
    """
    n = get_int(spec, "num_sessions", minimum=1)
    turns = sample_lengths(spec.get("turns", 1), n, rng, "turns")
    total = int(turns.sum())
    first = sample_lengths(spec.get("first_input_len") or spec.get("input_len"), n, rng,
                           "first_input_len")
    inputs = sample_lengths(spec.get("input_len"), total, rng, "input_len")
    outputs = sample_lengths(spec.get("output_len"), total, rng, "output_len")
    thinks = sample_seconds(spec.get("think_time_s"), total, rng, "think_time_s")
    out: list[WorkloadRequest] = []
    k = 0
    for s in range(n):
        msgs = []
        for t in range(int(turns[s])):
            length = int(first[s]) if t == 0 else int(inputs[k])
            msgs.append((random_tokens(rng, length, vocab_size), int(outputs[k]),
                         float(thinks[k])))
            k += 1
        out += session_requests(f"s{s}", msgs)
    cap = spec.get("num_requests")
    if cap is not None:
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise WorkloadError(f"workload.num_requests={cap!r} must be a positive integer or "
                                "null")
        out = out[:cap]
    return out


def session_requests(session_id: str,
                     turns: Iterable[tuple[list[int], int, float]]) -> list[WorkloadRequest]:
    """One conversation as requests: (new message tokens, answer tokens, think time before
    this turn) per turn; the first turn's think time is ignored."""
    out = []
    for t, (message, max_tokens, think) in enumerate(turns):
        if not message or max_tokens < 1:
            raise WorkloadError(f"session {session_id} turn {t}: a turn needs a message and "
                                "at least one answer token")
        out.append(WorkloadRequest(list(message), max_tokens, session_id=session_id, turn=t,
                                   think_time_s=0.0 if t == 0 else think))
    return out


def next_turns(workload: list[WorkloadRequest]) -> dict[int, int]:
    """Index of each turn -> index of the session's next turn (for the run loop).

    Raises:
        ValueError: a session's turns are not 0, 1, ... in workload order.
    """
    last: dict[str, tuple[int, int]] = {}
    nxt: dict[int, int] = {}
    for i, w in enumerate(workload):
        if w.session_id is None:
            continue
        prev = last.get(w.session_id)
        expect = 0 if prev is None else prev[1] + 1
        if w.turn != expect:
            raise ValueError(f"session {w.session_id}: turn {w.turn} where turn {expect} was "
                             "expected (turns must follow each other in workload order)")
        if prev is not None:
            nxt[prev[0]] = i
        last[w.session_id] = (i, w.turn)
    return nxt
