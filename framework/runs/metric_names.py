"""Metric names as `schedlab compare` and `report` take them: a results.json key, or a group's
metric.

- `mean_ttft_ms`: a top-level number of results.json;
- `per_client.<id>.<metric>`, `per_slo_class.<name>.<metric>`: one client's or SLO class's;
- `per_client.light*.mean_ttft_ms`: `<id>` a glob (`fnmatch`): the mean over the matching
  groups that have the metric (each client counts once, however many requests it sent).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any, TypeGuard

#: results.json keys that hold one metrics dict per group
GROUP_KEYS = ("per_client", "per_slo_class")


def is_number(v: Any) -> TypeGuard[float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def split_name(name: str) -> tuple[str, str, str] | None:
    """`per_client.light*.mean_ttft_ms` -> ("per_client", "light*", "mean_ttft_ms"); None for a
    top-level name. A group id may contain dots: the metric is the last part."""
    head, _, rest = name.partition(".")
    if head not in GROUP_KEYS or "." not in rest:
        return None
    group, _, metric = rest.rpartition(".")
    return head, group, metric


def metric_value(metrics: Mapping[str, Any], name: str) -> float | None:
    """The value of `name` in one run's results (None where the run does not have it)."""
    parts = split_name(name)
    if parts is None:
        v = metrics.get(name)
        return float(v) if is_number(v) else None
    key, pattern, metric = parts
    groups = metrics.get(key) or {}
    vals = [float(g[metric]) for gid, g in groups.items()
            if fnmatchcase(str(gid), pattern) and isinstance(g, Mapping)
            and is_number(g.get(metric))]
    return sum(vals) / len(vals) if vals else None


def matching_groups(metrics: Mapping[str, Any], name: str) -> list[str]:
    """The group ids that `name`'s pattern matches in one run ([] for a top-level name)."""
    parts = split_name(name)
    if parts is None:
        return []
    key, pattern, _ = parts
    return [str(g) for g in (metrics.get(key) or {}) if fnmatchcase(str(g), pattern)]


def available(runs_metrics: Iterable[Mapping[str, Any]]) -> tuple[list[str], dict[str, str]]:
    """What can be asked for: the numeric top-level keys, and per group key a one-line summary
    such as "per_client.{heavy,light0}.{completed,mean_ttft_ms}"."""
    top: set[str] = set()
    ids: dict[str, dict[str, None]] = {k: {} for k in GROUP_KEYS}
    names: dict[str, dict[str, None]] = {k: {} for k in GROUP_KEYS}
    for m in runs_metrics:
        top.update(k for k, v in m.items() if is_number(v))
        for key in GROUP_KEYS:
            for gid, g in (m.get(key) or {}).items():
                ids[key][str(gid)] = None
                if isinstance(g, Mapping):
                    names[key].update((k, None) for k, v in g.items() if is_number(v))
    groups = {k: f"{k}.{{{','.join(ids[k])}}}.{{{','.join(names[k])}}}"
              for k in GROUP_KEYS if ids[k]}
    return sorted(top), groups


def group_defaults(runs_metrics: Iterable[Mapping[str, Any]],
                   metric: str = "mean_ttft_ms") -> list[str]:
    """One name per group of clients or SLO classes: ids that differ only in a trailing number
    (light0, light1) make one glob (`per_client.light*.mean_ttft_ms`)."""
    out: dict[str, None] = {}
    for m in runs_metrics:
        for key in GROUP_KEYS:
            for gid in m.get(key) or {}:
                stem = re.sub(r"\d+$", "", str(gid))
                out[f"{key}.{stem}*.{metric}" if stem and stem != str(gid)
                    else f"{key}.{gid}.{metric}"] = None
    return list(out)


def unknown_metric_message(name: str, runs_metrics: Sequence[Mapping[str, Any]]) -> str:
    """One sentence: `name` is not in these results, and what is."""
    top, groups = available(runs_metrics)
    parts = split_name(name)
    if parts is not None and parts[0] in groups:
        return (f"metric {name!r} matches no number in these {len(runs_metrics)} runs; "
                f"available: {groups[parts[0]]} (a group id may be a glob, e.g. "
                f"{parts[0]}.light*.mean_ttft_ms, the mean over the matching groups)")
    more = "; ".join(groups.values())
    return (f"metric {name!r} is not a number in these results; numeric metrics: "
            f"{', '.join(top)}" + (f"; grouped: {more} (a group id may be a glob)"
                                   if more else ""))
