"""The tables of `schedlab report`: which config keys to show, configurations (the runs of one
point over its seeds), medians over seeds, and the per-client / per-SLO-class tables.

A sweep's swept keys include ones that only follow another (a plugin's options follow its
name, `engine.seed` follows `seed`): `shown_parameters` drops those, so a column or a legend
names only what was chosen. Runs sort numerically by their parameters, then by seed.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Sequence
from typing import Any

#: config keys that hold a run's seed
SEED_KEYS = ("seed", "engine.seed")
#: columns of the per-client and per-SLO-class tables (keys of results.json's `per_client`)
GROUP_COLUMNS: tuple[tuple[str, str], ...] = (
    ("num_requests", "d"), ("completed", "d"), ("num_rejected", "d"), ("service", ".0f"),
    ("request_throughput", ".2f"), ("request_goodput", ".2f"), ("deadline_attainment", ".3f"),
    ("mean_ttft_ms", ".1f"), ("p99_ttft_ms", ".1f"), ("mean_tpot_ms", ".2f"),
)
GROUP_TITLES = (("per_client", "client"), ("per_slo_class", "SLO class"))


def _k(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def _determines(runs: Sequence[Any], a: str, b: str) -> bool:
    """True when each value of `a` comes with exactly one value of `b`."""
    seen: dict[str, set[str]] = {}
    for r in runs:
        seen.setdefault(_k(r.config.get(a)), set()).add(_k(r.config.get(b)))
    return all(len(v) == 1 for v in seen.values())


def shown_parameters(runs: Sequence[Any], swept: Sequence[str]) -> list[str]:
    """The swept keys worth a column, the seed last: a key that another key determines (and
    that does not determine it back, or comes later) is left out."""
    shown: list[str] = []
    for i, k in enumerate(swept):
        follows = any(_determines(runs, j, k) and (not _determines(runs, k, j) or swept.index(j)
                                                   < i)
                      for j in swept if j != k)
        if not follows:
            shown.append(k)
    return [k for k in shown if k not in SEED_KEYS] + [k for k in shown if k in SEED_KEYS]


def point_parameters(params: Sequence[str]) -> list[str]:
    """`params` without the seed: what makes a configuration."""
    return [p for p in params if p not in SEED_KEYS]


def seed_of(run: Any) -> Any:
    for k in SEED_KEYS:
        if run.config.get(k) is not None:
            return run.config[k]
    return None


def sort_key(v: Any) -> tuple[int, Any]:
    """Numbers ascending, then text in natural order ("run2" before "run10"), None first."""
    if v is None:
        return (0, 0)
    if isinstance(v, int | float) and not isinstance(v, bool):
        return (1, v)
    return (2, [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(v))])


def run_order(params: Sequence[str]):
    """A sort key for runs: their parameters, then seed, then name, all numerically."""
    return lambda r: ([sort_key(r.config.get(p)) for p in params], sort_key(seed_of(r)),
                      sort_key(r.name))


def configurations(runs: Sequence[Any], params: Sequence[str]) -> list[tuple[dict, list]]:
    """The runs grouped by their values of `params` (seeds together), in numeric order."""
    groups: dict[str, tuple[dict, list]] = {}
    for r in sorted(runs, key=run_order(params)):
        point = {p: r.config.get(p) for p in params}
        groups.setdefault(_k(point), (point, []))[1].append(r)
    return list(groups.values())


def median(values: Sequence[Any]) -> float | None:
    xs = [float(v) for v in values
          if isinstance(v, int | float) and not isinstance(v, bool)]
    return statistics.median(xs) if xs else None


def cell(v: Any, fmt: str | None) -> str:
    """A table cell: "-" for None; "d" shows a whole number, or one decimal (a median of
    counts may fall between two)."""
    if v is None:
        return "-"
    if fmt and isinstance(v, int | float) and not isinstance(v, bool):
        if fmt == "d":
            return f"{round(v):d}" if float(v).is_integer() else f"{v:.1f}"
        return f"{v:{fmt}}"
    return str(v)


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                      *("| " + " | ".join(r) + " |" for r in rows)])


def medians_table(runs: Sequence[Any], params: Sequence[str],
                  columns: Sequence[tuple[str, str]]) -> str:
    """One row per configuration: its seeds and each metric's median over them."""
    point = point_parameters(params)
    metrics = [(k, f) for k, f in columns if any(r.metrics.get(k) is not None for r in runs)]
    rows = []
    for values, members in configurations(runs, point):
        seeds = [seed_of(r) for r in members]
        rows.append([*(cell(values[p], None) for p in point),
                     ",".join(cell(s, None) for s in seeds),
                     *(cell(median([r.metrics.get(k) for r in members]), f)
                       for k, f in metrics)])
    return markdown([*point, "seeds", *(k for k, _ in metrics)], rows)


def group_medians_table(runs: Sequence[Any], params: Sequence[str], key: str) -> str:
    """Per configuration and group (client or SLO class): the median over seeds."""
    point = point_parameters(params)
    rows = []
    for values, members in configurations(runs, point):
        names = sorted({g for r in members for g in (r.metrics.get(key) or {})}, key=sort_key)
        for name in names:
            gs = [(r.metrics.get(key) or {}).get(name) or {} for r in members]
            n = sum(1 for g in gs if g)
            rows.append([*(cell(values[p], None) for p in point), name, str(n),
                         *(cell(median([g.get(c) for g in gs]), f) for c, f in GROUP_COLUMNS)])
    return markdown([*point, "group", "seeds", *(c for c, _ in GROUP_COLUMNS)], rows)


def group_runs_table(runs: Sequence[Any], params: Sequence[str], key: str) -> str:
    """One row per run and group, with the run's parameters and seed."""
    rows = []
    for r in sorted(runs, key=run_order(point_parameters(params))):
        for name, g in sorted((r.metrics.get(key) or {}).items(), key=lambda t: sort_key(t[0])):
            rows.append([r.name, *(cell(r.config.get(p), None) for p in params), name,
                         *(cell(g.get(c), f) for c, f in GROUP_COLUMNS)])
    return markdown(["run", *params, "group", *(c for c, _ in GROUP_COLUMNS)], rows)
