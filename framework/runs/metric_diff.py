"""One metric, candidate vs baseline over paired seeds: the difference, the ratio, their
intervals and a verdict (`diff_metric`), by one of these methods:

- "t" (the default): the mean difference with its paired t interval and p-value. It assumes
  the mean of the differences is normal (roughly normal differences), and it is the one
  method that can say something at 3-5 seeds: the exact rank tests cannot reach 95% below 6
  pairs (their smallest two-sided p-value is 2 / 2^n = 0.0625 at 5), and a percentile
  bootstrap of 5 values is too narrow (its "95%" interval from 3 pairs is [min, max]).
  The paired t test is what a reviewer expects at a handful of seeds, with its assumption
  stated; use "wilcoxon" or "sign" from 6 seeds on to drop it.
- "wilcoxon": the Hodges-Lehmann estimate with the exact signed-rank interval and p-value
  (assumes the differences symmetric).
- "sign": the median difference with its exact order-statistic interval and p-value.
- "percentile", "bca": a bootstrap interval of `statistic` (mean or median), for many seeds;
  below `min_pairs(confidence)` pairs (6 at 95%) the verdict is "too few seeds".

Every number in a row is the method's statistic: with "t" the baseline, candidate and
difference are means (so candidate - baseline = the difference), with the rank tests medians;
the ratio is the same statistic of log(candidate / baseline), back-transformed (the geometric
mean ratio for "t").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from schedlab.runs.bootstrap import Interval, bootstrap_ci, min_pairs
from schedlab.runs.metric_names import is_number
from schedlab.runs.paired import ESTIMATE, TESTS, min_pairs_for, paired_test

SIGNIFICANT, NOT_SIGNIFICANT, TOO_FEW = "significant", "not significant", "too few seeds"
#: every --method: the paired tests first (t is the default), then the bootstraps
BOOTSTRAPS = ("percentile", "bca")
METHODS = (*TESTS, *BOOTSTRAPS)
DEFAULT_METHOD = "t"
#: relative size under which a paired difference counts as none
_ROUNDING = 1e-9


@dataclass(frozen=True, slots=True)
class MetricDiff:
    """One metric, candidate vs baseline, over the seeds both have.

    `diff` (candidate - baseline, in the metric's unit) is the report's `statistic` over the
    pairs, `baseline` and `candidate` the mean (statistic mean) or median of each side; `ci`
    is the interval of `diff`; `ratio` and `ratio_ci` the same statistic of candidate /
    baseline (None unless every value is positive); `p_value` the test's (None for a
    bootstrap, or t from one pair).
    """

    metric: str
    n: int
    baseline: float | None
    candidate: float | None
    diff: float | None
    ci: Interval | None
    ratio: float | None
    ratio_ci: Interval | None
    p_value: float | None
    verdict: str  # SIGNIFICANT | NOT_SIGNIFICANT | TOO_FEW

    @property
    def significant(self) -> bool:
        return self.verdict == SIGNIFICANT


def row_statistic(method: str, statistic: str = "mean") -> str:
    """What the numbers of a row are under `method`: mean, median or pseudo-median."""
    return ESTIMATE.get(method, statistic)


def needed_pairs(method: str, confidence: float) -> int:
    """The fewest pairs for a verdict other than TOO_FEW under `method`."""
    return min_pairs(confidence) if method in BOOTSTRAPS else min_pairs_for(method, confidence)


def diff_metric(metric: str, base: Sequence[float | None], cand: Sequence[float | None],
                confidence: float = 0.95, method: str = DEFAULT_METHOD,
                statistic: str = "mean", resamples: int = 10_000, seed: int = 0,
                needed: int | None = None) -> MetricDiff:
    """Compare paired values of one metric (base[i] and cand[i] share a seed).

    Pairs where either side is missing or not finite are left out. The verdict is TOO_FEW
    below `needed` pairs (default `needed_pairs(method, confidence)`) or where the method
    cannot reach the confidence, else SIGNIFICANT when the test rejects "no difference" (a
    bootstrap: when the interval excludes 0).
    """
    pairs = [(float(b), float(c)) for b, c in zip(base, cand, strict=True)
             if is_number(b) and is_number(c)]
    n = len(pairs)
    needed = needed_pairs(method, confidence) if needed is None else needed
    if n == 0:
        return MetricDiff(metric, 0, None, None, None, None, None, None, None, TOO_FEW)
    b = np.array([p[0] for p in pairs])
    c = np.array([p[1] for p in pairs])
    stat = row_statistic(method, statistic)
    center = np.mean if stat == "mean" else np.median  # of each side (pseudo-median: median)
    positive = bool(np.all(b > 0) and np.all(c > 0))
    logs = np.log(c / b) if positive else None
    d = c - b
    # NOTE: a difference at rounding level (the same schedule summed in another order) is none
    scale = float(max(np.abs(b).max(), np.abs(c).max()))
    d[np.abs(d) <= _ROUNDING * scale] = 0.0
    if logs is not None:
        logs[np.abs(logs) <= _ROUNDING] = 0.0
    ratio = ratio_ci = p = None
    if method in TESTS:
        res = paired_test(method, d, confidence)
        diff, ci, p = res.estimate, res.ci, res.p_value
        if logs is not None:
            lr = paired_test(method, logs, confidence)
            ratio = math.exp(lr.estimate)
            ratio_ci = Interval(math.exp(lr.ci.lo), math.exp(lr.ci.hi)) if lr.ci else None
        judged = ci is not None and p is not None
        rejects = ci is not None and p is not None and p < 1.0 - confidence
    else:
        diff, ci = float(center(d)), None
        if n >= 2:
            ci = bootstrap_ci(d, stat, confidence=confidence, resamples=resamples,
                              method=method, seed=seed)
            if logs is not None:
                log_ci = bootstrap_ci(logs, stat, confidence=confidence, resamples=resamples,
                                      method=method, seed=seed)
                ratio_ci = Interval(math.exp(log_ci.lo), math.exp(log_ci.hi))
        if logs is not None:
            ratio = math.exp(float(center(logs)))
        judged = ci is not None
        rejects = ci is not None and not ci.covers(0.0)
    if n < max(needed, 2) or not judged:
        verdict = TOO_FEW
    else:
        verdict = SIGNIFICANT if rejects else NOT_SIGNIFICANT
    return MetricDiff(metric, n, float(center(b)), float(center(c)), float(diff), ci, ratio,
                      ratio_ci, p, verdict)
