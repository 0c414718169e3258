"""Workloads: the requests a run submits, with arrival times, prompts and output limits.

`build_workload(spec, vocab_size, seed)` turns a plain dict (the CLI converts its config to one)
into a list of `WorkloadRequest`s. Three kinds:

- `synthetic`: random-token prompts (like vLLM's `random` dataset) with lengths drawn from
  `input_len` / `output_len`;
- `shared_prefix`: `num_groups` system prompts of `prefix_len` tokens, each request one of them
  followed by its own suffix of `input_len` tokens;
- `trace`: a file (ShareGPT, Azure LLM inference trace, BurstGPT, JSONL), see
  `schedlab.runs.traces`.

Arrival times come from `arrival` (`offline`, `poisson`, `gamma`) or, for timestamped traces,
from the file. The same spec and seed always give the same workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from schedlab.runs.distributions import (
    DISTRIBUTIONS,
    FIRST_TOKEN_ID,
    PROCESSES,
    WorkloadError,
    WorkloadRequest,
    arrival_times,
    get_int,
    get_key,
    random_tokens,
    sample_lengths,
    set_arrivals,
)
from schedlab.runs.traces import load_trace

__all__ = ["TYPES", "DISTRIBUTIONS", "PROCESSES", "FIRST_TOKEN_ID", "WorkloadError",
           "WorkloadRequest", "arrival_times", "build_workload", "random_tokens",
           "sample_lengths"]

TYPES = ("synthetic", "shared_prefix", "trace")


def build_workload(
    spec: Mapping[str, Any], vocab_size: int, seed: int = 0
) -> list[WorkloadRequest]:
    """Build the requests a spec describes, sorted by arrival time.

    Args:
        spec: `type` ("synthetic" | "shared_prefix" | "trace"), `num_requests`, `input_len`,
            `output_len`, `arrival`, and per type `num_groups`, `prefix_len` or `path`,
            `format`, `time_scale`, `max_rows`. `oracle_output_len` (default true) sets each
            request's `expected_output_len` to its true output length; `priority_levels` K
            gives each request a uniform random priority in [0, K) (trace files may carry
            their own `priority`).
        vocab_size: the model's vocabulary; random token ids lie in [2, vocab_size).
        seed: seeds every random draw.

    Returns:
        The requests, ordered by `arrival_s` (ties keep their generation order).

    Raises:
        WorkloadError: a spec value is missing or out of range (the message names the key and
            the accepted values), or a trace file is malformed (file name and line).
    """
    if not isinstance(spec, Mapping):
        raise WorkloadError(f"workload spec must be a mapping, got {type(spec).__name__}")
    if not isinstance(vocab_size, int) or vocab_size <= FIRST_TOKEN_ID:
        raise WorkloadError(f"vocab_size={vocab_size!r} must be an integer > {FIRST_TOKEN_ID}")
    kind = spec.get("type", "synthetic")
    if kind not in TYPES:
        raise WorkloadError(f"workload.type={kind!r}; accepted: {', '.join(TYPES)}")
    rng = np.random.default_rng(seed)
    if kind == "trace":
        reqs = load_trace(spec, vocab_size, rng)
        arrival = spec.get("arrival")
        if arrival is not None and get_key(arrival, "process", "arrival", "offline") != "trace":
            set_arrivals(reqs, arrival, rng)
    else:
        n = get_int(spec, "num_requests", minimum=1)
        inputs = sample_lengths(spec.get("input_len"), n, rng, "input_len")
        outputs = sample_lengths(spec.get("output_len"), n, rng, "output_len")
        if kind == "synthetic":
            prompts = [random_tokens(rng, int(k), vocab_size) for k in inputs]
        else:
            prompts = _shared_prefix_prompts(spec, inputs, vocab_size, rng)
        reqs = [WorkloadRequest(p, int(o)) for p, o in zip(prompts, outputs, strict=True)]
        set_arrivals(reqs, spec.get("arrival"), rng)
    oracle = spec.get("oracle_output_len", True)
    for r in reqs:
        r.expected_output_len = r.max_tokens if oracle else None
    levels = spec.get("priority_levels")
    if levels is not None:
        levels = get_int(spec, "priority_levels", minimum=1)
        for r, p in zip(reqs, rng.integers(0, levels, size=len(reqs)), strict=True):
            r.priority = int(p)
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i].arrival_s, i))
    return [reqs[i] for i in order]

def _shared_prefix_prompts(spec: Mapping[str, Any], suffix_lens: np.ndarray, vocab_size: int,
                           rng: np.random.Generator) -> list[list[int]]:
    groups = get_int(spec, "num_groups", minimum=1)
    prefix_len = get_int(spec, "prefix_len", minimum=0)
    prefixes = [random_tokens(rng, prefix_len, vocab_size) for _ in range(groups)]
    # round-robin over groups, so every group gets requests and arrivals interleave
    return [prefixes[i % groups] + random_tokens(rng, int(k), vocab_size)
            for i, k in enumerate(suffix_lens)]
