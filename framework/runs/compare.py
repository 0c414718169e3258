"""Paired comparisons over seeds: is one setting of a swept parameter better than another?

A sweep that runs every point with several seeds (`schedlab run -m ... seed=0,1,2,3,4`) gives,
for two values of one parameter, runs that differ only in that parameter and share a seed,
i.e. the same workload draw. `compare_runs` pairs them seed by seed within every combination
of the other swept parameters and judges each metric's paired differences with
`schedlab.runs.metric_diff.diff_metric` (paired t by default; Wilcoxon, sign, bootstrap).
Pairing removes the workload's share of the run-to-run noise.

Metric names may be a group's: `per_client.<id>.<metric>`, `per_slo_class.<name>.<metric>`,
with a glob for the id (`per_client.light*.mean_ttft_ms`, the mean over the matching
clients); see `schedlab.runs.metric_names`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedlab.runs.bootstrap import STATISTICS
from schedlab.runs.metric_diff import (
    DEFAULT_METHOD,
    METHODS,
    TOO_FEW,
    MetricDiff,
    diff_metric,
    needed_pairs,
    row_statistic,
)
from schedlab.runs.metric_names import (
    group_defaults,
    is_number,
    metric_value,
    unknown_metric_message,
)
from schedlab.runs.report import COLUMNS, ReportError, RunRecord, find_runs, swept_parameters

#: config keys that hold a run's seed, in the order they are tried for pairing
SEED_KEYS = ("seed", "engine.seed")


class CompareError(ValueError):
    """A comparison that cannot be made; the message is one sentence saying why."""


@dataclass(frozen=True, slots=True)
class Comparison:
    """One value of the compared parameter against the baseline, at one setting of the others."""

    candidate: Any
    context: dict[str, Any]  # the other swept parameters, fixed for both sides
    seeds: tuple[Any, ...]  # paired seeds
    unpaired: tuple[Any, ...]  # seeds that only one side has (left out)
    metrics: tuple[MetricDiff, ...]


@dataclass(frozen=True, slots=True)
class CompareReport:
    """Everything `compare_runs` found, with the settings that produced it."""

    by: str
    baseline: Any
    implied: tuple[str, ...]  # swept keys that change together with `by` (a variant's parts)
    confidence: float
    method: str
    statistic: str  # what every number of a row is: mean, median or pseudo-median
    resamples: int
    seed: int
    min_pairs: int
    comparisons: tuple[Comparison, ...] = field(default_factory=tuple)

    @property
    def num_tests(self) -> int:
        """How many intervals were judged (for the multiple-comparisons caveat)."""
        return sum(m.verdict != TOO_FEW for c in self.comparisons for m in c.metrics)


# ---- pairing runs ----------------------------------------------------------------------
def load_runs(root: Path) -> list[RunRecord]:
    """Every results.json under `root` (a run or multirun directory).

    Raises:
        CompareError: `root` is not a directory or holds no readable results.json.
    """
    try:
        return find_runs(Path(root))
    except ReportError as e:
        raise CompareError(str(e)) from None


def compare_runs(runs: Sequence[RunRecord], by: str, baseline: Any = None,
                 metrics: Sequence[str] | None = None, confidence: float = 0.95,
                 resamples: int = 10_000, method: str = DEFAULT_METHOD,
                 statistic: str = "mean", seed: int = 0,
                 needed: int | None = None) -> CompareReport:
    """Compare every value of the swept parameter `by` with `baseline`, paired by seed.

    Runs are grouped by the other swept parameters (the context); within a context, each
    candidate value's run with seed s is paired with the baseline's run with seed s. Swept
    keys that take one value per value of `by` (e.g. the scheduler a variant name picks) move
    with `by` and are listed in `implied`, not treated as context.

    Args:
        runs: the runs (`load_runs(dir)`), each with a flattened config.
        by: the config key compared, e.g. "scheduler.name"; it must differ between runs.
        baseline: the value compared against (matched on its text too, so "8" finds 8);
            default the first value in order (None, then numbers ascending, then text).
        metrics: results.json keys or group metrics (`per_client.light*.mean_ttft_ms`);
            default the report's columns that the runs have, then each client group's and
            SLO class's mean TTFT.
        confidence: the two-sided level of every interval and test.
        method: one of METHODS (see the module's docstring).
        statistic: mean or median, for a bootstrap method (the tests fix their own).
        resamples, seed: the bootstrap's (see `bootstrap_ci`).
        needed: pairs needed for a verdict other than TOO_FEW (default `needed_pairs`).

    Returns:
        A CompareReport with one Comparison per (context, candidate value).

    Raises:
        CompareError: `by` is not swept, the baseline or a metric is unknown, a run has no
            seed, two runs would claim one seed, or no seed is shared by two values of `by`.
    """
    if not 0.0 < confidence < 1.0:
        raise CompareError(f"--confidence must lie between 0 and 1, not {confidence}")
    if resamples < 100:
        raise CompareError(f"--resamples must be at least 100, not {resamples}")
    if method not in METHODS or statistic not in STATISTICS:
        raise CompareError(f"--method must be one of {', '.join(METHODS)} and --statistic one "
                           f"of {', '.join(STATISTICS)}, not {method} and {statistic}")
    swept = swept_parameters(runs)
    if by not in swept:
        others = [k for k in swept if k not in SEED_KEYS]
        raise CompareError(f"--by {by} is not a swept parameter of these {len(runs)} runs; "
                           f"swept: {', '.join(others) or 'nothing but the seed'}")
    values = sorted({_key(r.config.get(by)): r.config.get(by) for r in runs}.values(),
                    key=_order)
    base = values[0] if baseline is None else _match(baseline, values, by)
    metrics = _metrics(runs, metrics)
    unseeded = [r.name for r in runs if _seed(r) is None]
    if unseeded:
        raise CompareError(f"{len(unseeded)} of {len(runs)} runs have no seed in their config "
                           f"({' or '.join(SEED_KEYS)}), e.g. {unseeded[0]}, so there is "
                           "nothing to pair them by")
    rest = [k for k in swept if k != by and k not in SEED_KEYS]
    implied = tuple(k for k in rest if _moves_with(runs, by, k))
    context_keys = [k for k in rest if k not in implied]
    cells: dict[tuple[str, str], dict[Any, RunRecord]] = {}
    contexts: dict[str, dict[str, Any]] = {}
    for r in runs:
        ctx = {k: r.config.get(k) for k in context_keys}
        ck = _key([ctx[k] for k in context_keys])
        contexts.setdefault(ck, ctx)
        cell = cells.setdefault((ck, _key(r.config.get(by))), {})
        s = _seed(r)
        if s in cell:
            raise CompareError(f"runs {cell[s].name} and {r.name} have the same {by}, seed and "
                               "swept parameters, so a pair cannot be formed; compare one "
                               "sweep at a time")
        cell[s] = r
    comparisons = []
    for ck in sorted(contexts, key=lambda k: [_order(v) for v in contexts[k].values()]):
        b_cell = cells.get((ck, _key(base)), {})
        for value in values:
            c_cell = cells.get((ck, _key(value)))
            if value == base or c_cell is None or not b_cell:
                continue
            seeds = sorted(set(b_cell) & set(c_cell), key=_order)
            unpaired = sorted(set(b_cell) ^ set(c_cell), key=_order)
            diffs = tuple(diff_metric(m, [metric_value(b_cell[s].metrics, m) for s in seeds],
                                      [metric_value(c_cell[s].metrics, m) for s in seeds],
                                      confidence=confidence, resamples=resamples, method=method,
                                      statistic=statistic, seed=seed, needed=needed)
                          for m in metrics)
            comparisons.append(Comparison(value, contexts[ck], tuple(seeds), tuple(unpaired),
                                          diffs))
    if not any(len(c.seeds) >= 2 for c in comparisons):
        raise CompareError(_no_pairs_reason(runs, by, base, comparisons))
    return CompareReport(by, base, implied, confidence, method,
                         row_statistic(method, statistic), resamples, seed,
                         needed_pairs(method, confidence) if needed is None else needed,
                         tuple(comparisons))


def _no_pairs_reason(runs: Sequence[RunRecord], by: str, base: Any,
                     comparisons: Sequence[Comparison]) -> str:
    seeds = sorted({_seed(r) for r in runs}, key=_order)
    if len(seeds) < 2:
        return (f"every run has seed {seeds[0]}, so there is nothing to pair over seeds; "
                "sweep the seed too (e.g. seed=0,1,2,3,4,5,6,7)")
    if not comparisons:
        return (f"no other value of {by} was run at the same other parameters as the baseline "
                f"{by}={_text(base)}, so nothing can be paired")
    return (f"no seed was run both at {by}={_text(base)} and at another value with the same "
            "other parameters, so there are no pairs (at least 2 are needed)")


def _seed(r: RunRecord) -> Any:
    for k in SEED_KEYS:
        if r.config.get(k) is not None:
            return r.config[k]
    return None


def _moves_with(runs: Sequence[RunRecord], by: str, key: str) -> bool:
    """True when `key` takes exactly one value for each value of `by`."""
    seen: dict[str, set[str]] = {}
    for r in runs:
        seen.setdefault(_key(r.config.get(by)), set()).add(_key(r.config.get(key)))
    return all(len(v) == 1 for v in seen.values())


def _metrics(runs: Sequence[RunRecord], asked: Sequence[str] | None) -> list[str]:
    if not asked:
        numeric = sorted({k for r in runs for k, v in r.metrics.items() if is_number(v)})
        chosen = [k for k, _ in COLUMNS if k in numeric]
        groups = [g for g in group_defaults(r.metrics for r in runs)
                  if any(metric_value(r.metrics, g) is not None for r in runs)]
        return (chosen or numeric) + groups
    for m in asked:
        if all(metric_value(r.metrics, m) is None for r in runs):
            raise CompareError(unknown_metric_message(m, [r.metrics for r in runs]))
    return list(dict.fromkeys(asked))


def _match(arg: Any, values: Sequence[Any], by: str) -> Any:
    for v in values:
        if v == arg or _text(v) == str(arg) or _key(v) == str(arg) or (
                v is None and str(arg).lower() in ("none", "null")):
            return v
    raise CompareError(f"--baseline {arg} is not a value of {by} in these runs; values: "
                       f"{', '.join(_text(v) for v in values)}")


def _key(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def _text(v: Any) -> str:
    return "none" if v is None else str(v)


def _order(v: Any) -> tuple[int, Any]:
    if v is None:
        return (0, 0)
    if is_number(v):
        return (1, v)
    return (2, str(v))
