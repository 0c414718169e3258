"""Paired comparisons over seeds: is one setting of a swept parameter better than another?

A sweep that runs every point with several seeds (`schedlab run -m ... seed=0,1,2,3,4,5,6,7`)
gives, for two values of one parameter, runs that differ only in that parameter and share a
seed, i.e. the same workload draw. `compare_runs` pairs them seed by seed within every
combination of the other swept parameters, and per metric reports the paired differences
(candidate - baseline), their mean and median, a bootstrap confidence interval of the mean
difference (`schedlab.runs.bootstrap`), the paired ratio (geometric mean of candidate /
baseline, with its interval), and a verdict: "not significant" where the interval covers 0.

Pairing removes the workload's share of the run-to-run noise (both sides saw the same
requests), so a paired interval is much narrower than comparing two sets of seeds would be.

The bootstrap resamples the pairs with a seeded generator, so the same runs give the same
intervals. A percentile bootstrap cannot reach a confidence level from very few pairs: with n
pairs the most extreme resample (every draw the smallest difference) has probability n^-n, and
with 3 pairs a "95%" interval is just [min, max] of the differences, which excludes 0 for a quarter
of pure-noise comparisons. So below `min_pairs(confidence)` pairs (6 at 95%: the smallest n at
which even an exact sign test can reach the level) the verdict is "too few seeds", whatever
the interval says.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from schedlab.runs.bootstrap import METHODS, STATISTICS, Interval, bootstrap_ci, min_pairs
from schedlab.runs.report import COLUMNS, ReportError, RunRecord, find_runs, swept_parameters

#: config keys that hold a run's seed, in the order they are tried for pairing
SEED_KEYS = ("seed", "engine.seed")
SIGNIFICANT, NOT_SIGNIFICANT, TOO_FEW = "significant", "not significant", "too few seeds"


class CompareError(ValueError):
    """A comparison that cannot be made; the message is one sentence saying why."""


@dataclass(frozen=True, slots=True)
class MetricDiff:
    """One metric, candidate vs baseline, over the seeds both have.

    `mean_diff`, `median_diff` and `ci` are candidate - baseline in the metric's unit; `ratio`
    is the geometric mean of candidate / baseline over the pairs (None unless every value is
    positive). `ci` and `ratio_ci` are None with fewer than 2 pairs.
    """

    metric: str
    n: int
    baseline: float | None  # median over the paired seeds
    candidate: float | None
    mean_diff: float | None
    median_diff: float | None
    ci: Interval | None
    ratio: float | None
    ratio_ci: Interval | None
    verdict: str  # SIGNIFICANT | NOT_SIGNIFICANT | TOO_FEW

    @property
    def significant(self) -> bool:
        return self.verdict == SIGNIFICANT


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
    statistic: str
    resamples: int
    seed: int
    min_pairs: int
    comparisons: tuple[Comparison, ...] = field(default_factory=tuple)

    @property
    def num_tests(self) -> int:
        """How many intervals were judged (for the multiple-comparisons caveat)."""
        return sum(m.verdict != TOO_FEW for c in self.comparisons for m in c.metrics)


# ---- one metric ---------------------------------------------------------------------
def diff_metric(metric: str, base: Sequence[float | None], cand: Sequence[float | None],
                confidence: float = 0.95, resamples: int = 10_000, method: str = "percentile",
                statistic: str = "mean", seed: int = 0,
                needed: int | None = None) -> MetricDiff:
    """Compare paired values of one metric (base[i] and cand[i] share a seed).

    Pairs where either side is missing or not finite are left out. The interval is of the
    `statistic` (mean or median) of cand - base; the verdict is TOO_FEW below `needed` pairs
    (default `min_pairs(confidence)`), else NOT_SIGNIFICANT where the interval covers 0.
    """
    pairs = [(float(b), float(c)) for b, c in zip(base, cand, strict=True)
             if _finite(b) and _finite(c)]
    n = len(pairs)
    needed = min_pairs(confidence) if needed is None else needed
    if n == 0:
        return MetricDiff(metric, 0, None, None, None, None, None, None, None, TOO_FEW)
    b = np.array([p[0] for p in pairs])
    c = np.array([p[1] for p in pairs])
    d = c - b
    ci = ratio = ratio_ci = None
    positive = bool(np.all(b > 0) and np.all(c > 0))
    if positive:
        ratio = float(np.exp(np.mean(np.log(c / b))))
    if n >= 2:
        ci = bootstrap_ci(d, statistic, confidence=confidence, resamples=resamples,
                          method=method, seed=seed)
        if positive:
            log_ci = bootstrap_ci(np.log(c / b), "mean", confidence=confidence,
                                  resamples=resamples, method=method, seed=seed)
            ratio_ci = Interval(math.exp(log_ci.lo), math.exp(log_ci.hi))
    if n < max(needed, 2) or ci is None:
        verdict = TOO_FEW
    else:
        verdict = NOT_SIGNIFICANT if ci.covers(0.0) else SIGNIFICANT
    return MetricDiff(metric, n, float(np.median(b)), float(np.median(c)), float(np.mean(d)),
                      float(np.median(d)), ci, ratio, ratio_ci, verdict)


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
                 resamples: int = 10_000, method: str = "percentile", statistic: str = "mean",
                 seed: int = 0, needed: int | None = None) -> CompareReport:
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
        metrics: results.json keys; default the report's columns that the runs have.
        confidence, resamples, method, statistic, seed: see `bootstrap_ci`.
        needed: pairs needed for a verdict other than TOO_FEW (default `min_pairs`).

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
        raise CompareError(f"method must be one of {', '.join(METHODS)} and statistic one of "
                           f"{', '.join(STATISTICS)}")
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
            diffs = tuple(diff_metric(m, [b_cell[s].metrics.get(m) for s in seeds],
                                      [c_cell[s].metrics.get(m) for s in seeds],
                                      confidence=confidence, resamples=resamples, method=method,
                                      statistic=statistic, seed=seed, needed=needed)
                          for m in metrics)
            comparisons.append(Comparison(value, contexts[ck], tuple(seeds), tuple(unpaired),
                                          diffs))
    if not any(len(c.seeds) >= 2 for c in comparisons):
        raise CompareError(_no_pairs_reason(runs, by, base, comparisons))
    return CompareReport(by, base, implied, confidence, method, statistic, resamples, seed,
                         min_pairs(confidence) if needed is None else needed,
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
    numeric = sorted({k for r in runs for k, v in r.metrics.items() if _finite(v)})
    if not asked:
        chosen = [k for k, _ in COLUMNS if k in numeric]
        return chosen or numeric
    unknown = [m for m in asked if m not in numeric]
    if unknown:
        raise CompareError(f"metric {unknown[0]!r} is not a number in these results; "
                           f"numeric metrics: {', '.join(numeric)}")
    return list(dict.fromkeys(asked))


def _match(arg: Any, values: Sequence[Any], by: str) -> Any:
    for v in values:
        if v == arg or _text(v) == str(arg) or _key(v) == str(arg) or (
                v is None and str(arg).lower() in ("none", "null")):
            return v
    raise CompareError(f"--baseline {arg} is not a value of {by} in these runs; values: "
                       f"{', '.join(_text(v) for v in values)}")


def _finite(v: Any) -> TypeGuard[float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _key(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def _text(v: Any) -> str:
    return "none" if v is None else str(v)


def _order(v: Any) -> tuple[int, Any]:
    if v is None:
        return (0, 0)
    if _finite(v):
        return (1, v)
    return (2, str(v))
