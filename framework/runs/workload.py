"""Workloads: the requests a run submits, with arrival times, prompts and output limits.

`build_workload(spec, vocab_size, seed)` turns a plain dict (the CLI converts its config to one)
into a list of `WorkloadRequest`s. Three kinds:

- `synthetic`: random-token prompts (like vLLM's `random` dataset) with lengths drawn from
  `input_len` / `output_len`;
- `shared_prefix`: `num_groups` system prompts of `prefix_len` tokens, each request one of them
  followed by its own suffix of `input_len` tokens;
- `trace`: a file (ShareGPT, Azure LLM inference trace, BurstGPT, JSONL), see
  `schedlab.runs.traces`.

- `sessions`: multi-turn conversations (see `schedlab.runs.sessions`); a ShareGPT trace with
  `sessions: true` replays its conversations the same way.

Arrival times come from `arrival` (`offline`, `poisson`, `gamma`) or, for timestamped traces,
from the file. The same spec and seed always give the same workload.

Tenants and SLO tiers (any type), `clients` and `slo_classes`: `schedlab.runs.tenants`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from schedlab.runs.distributions import (
    ARRIVAL_KEYS,
    FIRST_TOKEN_ID,
    LENGTH_KEYS,
    SECONDS_DIST_KEYS,
    SECONDS_KEYS,
    WorkloadError,
    WorkloadRequest,
    check_dist_keys,
    check_keys,
    get_int,
    get_key,
    random_tokens,
    sample_lengths,
    set_arrivals,
)
from schedlab.runs.prompts import lazy_prompts
from schedlab.runs.sessions import SESSION_KEYS, build_sessions
from schedlab.runs.tenants import (
    apply_client_settings,
    apply_slo_classes,
    assign_clients,
    parse_clients,
    parse_slo_classes,
    set_arrivals_by_unit,
    split_counts,
)
from schedlab.runs.traces import TRACE_KEYS, load_trace

#: the keys every workload type reads (`build_workload`)
COMMON_KEYS = ("type", "num_requests", "output_len", "arrival", "oracle_output_len",
               "priority_levels", "clients", "slo_classes")
#: workload.type -> the keys of its own (its builder reads them)
TYPE_KEYS: dict[str, tuple[str, ...]] = {
    "synthetic": ("input_len",),
    "shared_prefix": ("input_len", "num_groups", "prefix_len"),
    "trace": TRACE_KEYS,
    "sessions": SESSION_KEYS,
}
TYPES = tuple(TYPE_KEYS)
#: a spec's (or a client's) nodes that are length specs (`sample_lengths`)
LENGTH_NODES = ("input_len", "output_len", "turns", "first_input_len")
_ARRIVAL = attrgetter("arrival_s")


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
    check_spec(spec)
    kind = spec.get("type", "synthetic")
    rng = np.random.default_rng(seed)
    clients = parse_clients(spec.get("clients"))
    by_rate = bool(clients) and clients[0].rate is not None
    if by_rate and kind not in ("synthetic", "shared_prefix"):
        raise WorkloadError(f"workload.clients: per-client 'rate' needs type synthetic or "
                            f"shared_prefix (type={kind} takes 'weight')")
    if kind == "trace" or kind == "sessions":
        reqs = (load_trace(spec, vocab_size, rng) if kind == "trace"
                else build_sessions(spec, vocab_size, rng))
        arrival = spec.get("arrival")
        if arrival is not None and get_key(arrival, "process", "arrival", "offline") != "trace":
            set_arrivals_by_unit(reqs, arrival, rng)
        if clients:
            assign_clients(reqs, clients, rng)
    elif clients:
        n = get_int(spec, "num_requests", minimum=1)
        reqs = []
        for c, k in zip(clients, split_counts(n, [c.share for c in clients]), strict=True):
            sub = _generate(kind, spec, k, vocab_size, rng, c.input_len, c.output_len)
            for r in sub:
                r.client_id = c.client_id
            if by_rate:
                set_arrivals(sub, {**(spec.get("arrival") or {}), "rate": c.rate}, rng)
            reqs += sub
        if not by_rate:
            reqs = [reqs[i] for i in rng.permutation(len(reqs))]
            set_arrivals(reqs, spec.get("arrival"), rng)
    else:
        reqs = _generate(kind, spec, get_int(spec, "num_requests", minimum=1), vocab_size, rng)
        set_arrivals(reqs, spec.get("arrival"), rng)
    oracle = spec.get("oracle_output_len", True)  # NOTE: a bool, as `check_spec` checked
    for r in reqs:
        r.expected_output_len = r.max_tokens if oracle else None
    levels = spec.get("priority_levels")
    if levels is not None:
        levels = get_int(spec, "priority_levels", minimum=1)
        for r, p in zip(reqs, rng.integers(0, levels, size=len(reqs)), strict=True):
            r.priority = int(p)
    apply_client_settings(reqs, clients)
    apply_slo_classes(reqs, parse_slo_classes(spec.get("slo_classes")), rng)
    return sorted(reqs, key=_ARRIVAL)  # NOTE: stable: ties keep their generation order


def spec_keys(spec: Mapping[str, Any], node: str = "") -> tuple[str, ...] | None:
    """The keys a workload spec takes at `workload.{node}` (`""`: the spec itself, for its
    `type`); None where the keys are not checked here (a list, a value, an unknown type)."""
    if not node:
        return (*COMMON_KEYS, *TYPE_KEYS[spec.get("type", "synthetic")]) if spec.get(
            "type", "synthetic") in TYPE_KEYS else None
    if node == "arrival":
        return ARRIVAL_KEYS
    if node in LENGTH_NODES:
        return LENGTH_KEYS
    if node == "think_time_s":
        return SECONDS_KEYS
    return None


def check_spec(spec: Mapping[str, Any]) -> None:
    """Check a spec's keys (its own, its `arrival`, length specs, clients and SLO classes) and
    its switches, reading no file and drawing nothing: what `build_workload` does first.

    Raises:
        WorkloadError: an unknown type or key (named, with the accepted keys) or a bad value.
    """
    kind = spec.get("type", "synthetic")
    if kind not in TYPES:
        raise WorkloadError(f"workload.type={kind!r}; accepted: {', '.join(TYPES)}")
    check_keys(spec, spec_keys(spec) or (), what=f"a type={kind} workload")
    for name, node in spec.items():
        accepted = spec_keys(spec, str(name))
        if accepted is not None:
            check_keys(node, accepted, str(name))
        if accepted is LENGTH_KEYS:
            check_dist_keys(node, str(name))
        elif accepted is SECONDS_KEYS:
            check_dist_keys(node, str(name), SECONDS_DIST_KEYS, "duration")
    oracle = spec.get("oracle_output_len", True)
    if not isinstance(oracle, bool):
        raise WorkloadError(f"workload.oracle_output_len={oracle!r}; accepted: true, false")
    parse_clients(spec.get("clients"))
    names = [c.name for c in parse_slo_classes(spec.get("slo_classes"))]
    for i, c in enumerate(spec.get("clients") or []):
        tier = c.get("slo_class")
        if names and tier is not None and str(tier) not in names:  # NOTE: else a plain label
            raise WorkloadError(f"workload.clients[{i}].slo_class={tier!r} (client "
                                f"{c['id']!r}) is not a class of workload.slo_classes; "
                                f"accepted: {', '.join(names)}")


def _generate(kind: str, spec: Mapping[str, Any], n: int, vocab_size: int,
              rng: np.random.Generator, input_len: Any = None,
              output_len: Any = None) -> list[WorkloadRequest]:
    """`n` synthetic or shared-prefix requests (arrivals unset)."""
    if n == 0:
        return []
    inputs = sample_lengths(input_len or spec.get("input_len"), n, rng, "input_len")
    outputs = sample_lengths(output_len or spec.get("output_len"), n, rng, "output_len")
    prompts: Sequence[Sequence[int]]
    if kind == "synthetic":
        prompts = lazy_prompts(rng, inputs, vocab_size)
    else:
        prompts = _shared_prefix_prompts(spec, inputs, vocab_size, rng)
    return [WorkloadRequest(p, o) for p, o in zip(prompts, outputs.tolist(), strict=True)]


def _shared_prefix_prompts(spec: Mapping[str, Any], suffix_lens: np.ndarray, vocab_size: int,
                           rng: np.random.Generator) -> list[list[int]]:
    groups = get_int(spec, "num_groups", minimum=1)
    prefix_len = get_int(spec, "prefix_len", minimum=0)
    prefixes = [random_tokens(rng, prefix_len, vocab_size) for _ in range(groups)]
    # round-robin over groups, so every group gets requests and arrivals interleave
    return [prefixes[i % groups] + random_tokens(rng, int(k), vocab_size)
            for i, k in enumerate(suffix_lens)]
