"""Tenants and SLO tiers of a workload (any type): `workload.clients` and `workload.slo_classes`.

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

`schedlab.runs.workload.build_workload` applies them; the draws are per request, or per
session (one draw for all its turns).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from schedlab.intake import MAX_PRIORITY
from schedlab.runs.distributions import (
    LENGTH_KEYS,
    WorkloadError,
    WorkloadRequest,
    check_dist_keys,
    check_keys,
    get_pos,
    set_arrivals,
)

#: the most clients a workload may have (`count` expanded): each is a Python object and a
#: row of per-client results
MAX_CLIENTS = 1_000_000
#: the keys of one `workload.clients` entry and of one `workload.slo_classes` entry
CLIENT_KEYS = ("id", "weight", "rate", "count", "priority", "slo_class", "input_len",
               "output_len")
SLO_CLASS_KEYS = ("name", "deadline_ms", "weight", "priority")


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


def _priority(entry: Mapping[str, Any], key: str) -> int | None:
    """A client's or SLO class's `priority`: None, or an integer within +-2**53."""
    prio = entry.get("priority")
    if prio is not None and (isinstance(prio, bool) or not isinstance(prio, int)
                             or abs(prio) > MAX_PRIORITY):
        raise WorkloadError(f"workload.{key}.priority={prio!r} must be an integer within +-2**53")
    return prio


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
        prio = _priority(c, key)
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
        prio = _priority(c, key)
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


def assign_clients(reqs: list[WorkloadRequest], clients: list[ClientSpec],
                    rng: np.random.Generator) -> None:
    _draw_per_unit(reqs, "client_id", [c.client_id for c in clients],
                   [c.share for c in clients], rng)


def apply_client_settings(reqs: list[WorkloadRequest], clients: list[ClientSpec]) -> None:
    by_id = {c.client_id: c for c in clients}
    for r in reqs:
        c = by_id.get(r.client_id) if r.client_id is not None else None
        if c is None:
            continue
        if c.priority is not None:
            r.priority = c.priority
        if c.slo_class is not None and r.slo_class is None:
            r.slo_class = str(c.slo_class)


def apply_slo_classes(reqs: list[WorkloadRequest], classes: list[SLOClass],
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
