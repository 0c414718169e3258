"""Bootstrap confidence intervals of a mean or median, seeded so they are reproducible.

No SciPy: the normal quantiles BCa needs come from `statistics.NormalDist`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

METHODS = ("percentile", "bca")
STATISTICS = ("mean", "median")


@dataclass(frozen=True, slots=True)
class Interval:
    """A bootstrap confidence interval."""

    lo: float
    hi: float

    def covers(self, x: float) -> bool:
        """Whether `x` lies inside the interval (ends included)."""
        return self.lo <= x <= self.hi



def min_pairs(confidence: float) -> int:
    """The fewest pairs at which an exact two-sided sign test can reach `confidence`:
    the smallest n with 2 * 0.5**n <= 1 - confidence (6 at 0.95, 5 at 0.90, 8 at 0.99)."""
    return max(2, math.ceil(math.log2(2.0 / (1.0 - confidence)) - 1e-9))


def bootstrap_ci(values: Sequence[float], statistic: str = "mean", confidence: float = 0.95,
                 resamples: int = 10_000, method: str = "percentile", seed: int = 0) -> Interval:
    """A bootstrap confidence interval of the mean or median of `values`.

    Args:
        values: the sample (at least 2 finite values).
        statistic: "mean" or "median".
        confidence: the two-sided level, in (0, 1).
        resamples: how many bootstrap resamples.
        method: "percentile", or "bca" (bias-corrected and accelerated, Efron 1987: shifts the
            percentiles for a skewed or biased statistic; acceleration from the jackknife).
        seed: the generator's seed; the same arguments always give the same interval.

    NOTE: at small n the interval is too narrow: simulated 95% intervals of a mean covered the
    truth ~85% of the time from 6 values, ~90% from 10, ~92% from 20 (both methods alike).

    Raises:
        ValueError: fewer than 2 values, or an unknown statistic or method.
    """
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or len(x) < 2 or not np.all(np.isfinite(x)):
        raise ValueError("a bootstrap interval needs at least 2 finite values")
    if statistic not in STATISTICS or method not in METHODS:
        raise ValueError(f"statistic must be one of {STATISTICS} and method one of {METHODS}")
    stat = np.mean if statistic == "mean" else np.median
    theta = float(stat(x))
    rng = np.random.default_rng(seed)
    boot = stat(x[rng.integers(0, len(x), size=(resamples, len(x)))], axis=1)
    alpha = (1.0 - confidence) / 2.0
    q = np.array([alpha, 1.0 - alpha])
    if method == "bca" and np.ptp(boot) > 0:
        q = _bca_levels(x, boot, theta, stat, q)
    lo, hi = np.quantile(boot, q)
    return Interval(float(lo), float(hi))


def _bca_levels(x: np.ndarray, boot: np.ndarray, theta: float, stat: Any,
                q: np.ndarray) -> np.ndarray:
    nd = NormalDist()
    b = len(boot)
    # NOTE: ties count half, so a discrete bootstrap distribution is not biased to one side
    p = (np.sum(boot < theta) + 0.5 * np.sum(boot == theta)) / b
    z0 = nd.inv_cdf(min(max(p, 1.0 / (b + 1)), b / (b + 1)))
    jack = np.array([stat(np.delete(x, i)) for i in range(len(x))])
    d = jack.mean() - jack
    den = 6.0 * float(np.sum(d**2)) ** 1.5
    a = float(np.sum(d**3)) / den if den > 0 else 0.0
    out = []
    for level in q:
        z = z0 + nd.inv_cdf(float(level))
        out.append(nd.cdf(z0 + z / (1.0 - a * z)))
    return np.clip(np.array(out), 0.0, 1.0)
