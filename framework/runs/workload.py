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

Tenants and SLO tiers (any type):

- `clients`: a list of `{id, weight | rate, count, priority, slo_class, input_len,
  output_len}`. With weights, each request (each session) belongs to a client in proportion
  to its weight; with rates (synthetic and shared_prefix only) every client sends its own
  arrival process (`arrival.process` at the client's `rate`) and `num_requests` is split in
  proportion to the rates, so every client spans about the same time. `count: k` expands to
  k clients `id0 .. id{k-1}` alike. A client's `input_len` / `output_len` replace the
  workload's for its requests; its `priority` / `slo_class` apply to all its requests.
- `slo_classes`: a list of `{name, deadline_ms, weight, priority}`. A request without an SLO
  class (from its client or its trace row) draws one by weight; a request with a class but no
  `deadline_ms` takes the class's deadline (and its `priority`, when the class sets one).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from schedlab.intake import MAX_PRIORITY
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
    get_pos,
    random_tokens,
    sample_lengths,
    set_arrivals,
)
from schedlab.runs.prompts import lazy_prompts
from schedlab.runs.sessions import SESSION_KEYS, build_sessions
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
#: the keys of one `workload.clients` entry and of one `workload.slo_classes` entry
#: the most clients a workload may have (`count` expanded): each is a Python object and a
#: row of per-client results
MAX_CLIENTS = 1_000_000
CLIENT_KEYS = ("id", "weight", "rate", "count", "priority", "slo_class", "input_len",
               "output_len")
SLO_CLASS_KEYS = ("name", "deadline_ms", "weight", "priority")
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
            _assign_clients(reqs, clients, rng)
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
    _apply_client_settings(reqs, clients)
    _apply_slo_classes(reqs, parse_slo_classes(spec.get("slo_classes")), rng)
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


# ---- tenants and SLO tiers -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ClientSpec:
    """One client of `workload.clients` (after `count` expansion)."""

    client_id: str
    share: float  # its weight, or its rate (req/s)
    rate: float | None = None
    priority: int | None = None
    slo_class: str | None = None
    input_len: Any = None
    output_len: Any = None


@dataclass(frozen=True, slots=True)
class SLOClass:
    """One tier of `workload.slo_classes`."""

    name: str
    deadline_ms: float | None
    weight: float = 1.0
    priority: int | None = None


def parse_clients(value: Any) -> list[ClientSpec]:
    """`workload.clients` as `ClientSpec`s ([] for null).

    Raises:
        WorkloadError: a malformed entry, or weights and rates mixed.
    """
    if value is None:
        return []
    if isinstance(value, Mapping) or not isinstance(value, Sequence) or isinstance(value, str):
        raise WorkloadError(f"workload.clients={value!r} must be a list of mappings")
    out: list[ClientSpec] = []
    for i, c in enumerate(value):
        key = f"clients[{i}]"
        if isinstance(c, Mapping):
            named = f"client {c['id']!r}" if c.get("id") not in (None, "") else ""
            check_keys(c, CLIENT_KEYS, key, "a client", named)
            for node in ("input_len", "output_len"):
                check_keys(c.get(node), LENGTH_KEYS, f"{key}.{node}")
                check_dist_keys(c.get(node), f"{key}.{node}")
        if not isinstance(c, Mapping) or c.get("id") in (None, ""):
            raise WorkloadError(f"workload.{key}={c!r} must be a mapping with an 'id'")
        if (c.get("rate") is None) == (c.get("weight") is None) and c.get("rate") is not None:
            raise WorkloadError(f"workload.{key}: give 'weight' or 'rate', not both")
        rate = None if c.get("rate") is None else get_pos(c, "rate", key)
        share = rate if rate is not None else get_pos(c, "weight", key, 1.0)
        count = c.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise WorkloadError(f"workload.{key}.count={count!r} must be an integer >= 1")
        if len(out) + count > MAX_CLIENTS:
            raise WorkloadError(f"workload.{key}.count={count!r} makes more than {MAX_CLIENTS:,} "
                                "clients in all; a workload has at most that many")
        prio = c.get("priority")
        if prio is not None and (isinstance(prio, bool) or not isinstance(prio, int)
                                 or abs(prio) > MAX_PRIORITY):
            raise WorkloadError(f"workload.{key}.priority={prio!r} must be an integer within "
                                "+-2**53")
        ids = [str(c["id"])] if count == 1 else [f"{c['id']}{j}" for j in range(count)]
        for cid in ids:
            out.append(ClientSpec(cid, share, rate, prio, c.get("slo_class"),
                                  c.get("input_len"), c.get("output_len")))
    if len({c.client_id for c in out}) != len(out):
        raise WorkloadError("workload.clients: client ids must be unique")
    if not math.isfinite(sum(c.share for c in out)):
        raise WorkloadError("workload.clients: the weights (or rates) add up to more than a "
                            "float holds; scale them down")
    if len({c.rate is None for c in out}) > 1:
        raise WorkloadError("workload.clients: give every client a 'rate' or none (weights)")
    return out


def parse_slo_classes(value: Any) -> list[SLOClass]:
    """`workload.slo_classes` as `SLOClass`es ([] for null).

    Raises:
        WorkloadError: a malformed entry.
    """
    if value is None:
        return []
    if isinstance(value, Mapping) or not isinstance(value, Sequence) or isinstance(value, str):
        raise WorkloadError(f"workload.slo_classes={value!r} must be a list of mappings")
    out = []
    for i, c in enumerate(value):
        key = f"slo_classes[{i}]"
        if isinstance(c, Mapping):
            named = f"class {c['name']!r}" if c.get("name") not in (None, "") else ""
            check_keys(c, SLO_CLASS_KEYS, key, "an SLO class", named)
        if not isinstance(c, Mapping) or c.get("name") in (None, ""):
            raise WorkloadError(f"workload.{key}={c!r} must be a mapping with a 'name'")
        deadline = (None if c.get("deadline_ms") is None
                    else get_pos(c, "deadline_ms", key, allow_inf=True))
        prio = c.get("priority")
        if prio is not None and (isinstance(prio, bool) or not isinstance(prio, int)
                                 or abs(prio) > MAX_PRIORITY):
            raise WorkloadError(f"workload.{key}.priority={prio!r} must be an integer within "
                                "+-2**53")
        out.append(SLOClass(str(c["name"]), deadline, get_pos(c, "weight", key, 1.0), prio))
    if len({c.name for c in out}) != len(out):
        raise WorkloadError("workload.slo_classes: class names must be unique")
    if not math.isfinite(sum(c.weight for c in out)):
        raise WorkloadError("workload.slo_classes: the weights add up to more than a float "
                            "holds; scale them down")
    return out


def split_counts(n: int, shares: Sequence[float]) -> list[int]:
    """`n` split in proportion to `shares` (largest remainder; the counts sum to `n`)."""
    total = float(sum(shares))
    exact = [n * s / total for s in shares]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(shares)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    return counts


def _units(reqs: list[WorkloadRequest]) -> list[list[WorkloadRequest]]:
    """Requests grouped so a session's turns share one draw (client, class, arrival)."""
    groups: dict[Any, list[WorkloadRequest]] = {}
    for i, r in enumerate(reqs):
        groups.setdefault(("s", r.session_id) if r.session_id is not None else ("r", i),
                          []).append(r)
    return list(groups.values())


def set_arrivals_by_unit(reqs: list[WorkloadRequest], arrival: Any,
                         rng: np.random.Generator) -> None:
    """Arrival times per request, or per session (all its turns get the session's start)."""
    units = _units(reqs)
    starts = [WorkloadRequest([], 1) for _ in units]
    set_arrivals(starts, arrival, rng)
    for unit, s in zip(units, starts, strict=True):
        for r in unit:
            r.arrival_s = s.arrival_s


def _draw_per_unit(reqs: list[WorkloadRequest], attr: str, choices: list[Any],
                   weights: list[float], rng: np.random.Generator) -> None:
    """Set `attr` to one of `choices`, drawn by `weights`, on each request or session (one draw
    for all its turns) that has none yet."""
    units = [u for u in _units(reqs) if getattr(u[0], attr) is None]
    p = np.asarray(weights, dtype=float)
    for unit, k in zip(units, rng.choice(len(choices), size=len(units), p=p / p.sum()),
                       strict=True):
        for r in unit:
            setattr(r, attr, choices[int(k)])


def _assign_clients(reqs: list[WorkloadRequest], clients: list[ClientSpec],
                    rng: np.random.Generator) -> None:
    _draw_per_unit(reqs, "client_id", [c.client_id for c in clients],
                   [c.share for c in clients], rng)


def _apply_client_settings(reqs: list[WorkloadRequest], clients: list[ClientSpec]) -> None:
    by_id = {c.client_id: c for c in clients}
    for r in reqs:
        c = by_id.get(r.client_id) if r.client_id is not None else None
        if c is None:
            continue
        if c.priority is not None:
            r.priority = c.priority
        if c.slo_class is not None and r.slo_class is None:
            r.slo_class = str(c.slo_class)


def _apply_slo_classes(reqs: list[WorkloadRequest], classes: list[SLOClass],
                       rng: np.random.Generator) -> None:
    if not classes:
        return
    by_name = {c.name: c for c in classes}
    _draw_per_unit(reqs, "slo_class", [c.name for c in classes], [c.weight for c in classes], rng)
    for r in reqs:
        c = by_name.get(r.slo_class) if r.slo_class is not None else None
        if c is None:
            continue
        if r.deadline_ms is None:
            r.deadline_ms = c.deadline_ms
        if c.priority is not None:
            r.priority = c.priority

def _shared_prefix_prompts(spec: Mapping[str, Any], suffix_lens: np.ndarray, vocab_size: int,
                           rng: np.random.Generator) -> list[list[int]]:
    groups = get_int(spec, "num_groups", minimum=1)
    prefix_len = get_int(spec, "prefix_len", minimum=0)
    prefixes = [random_tokens(rng, prefix_len, vocab_size) for _ in range(groups)]
    # round-robin over groups, so every group gets requests and arrivals interleave
    return [prefixes[i % groups] + random_tokens(rng, int(k), vocab_size)
            for i, k in enumerate(suffix_lens)]
