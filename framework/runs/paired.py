"""Paired tests with their intervals, valid at a handful of seeds: the paired t interval, the
exact Wilcoxon signed-rank test and the exact sign test. No SciPy.

Each takes the paired differences d_i = candidate_i - baseline_i and returns a `TestResult`:
the estimate (mean, Hodges-Lehmann pseudo-median, median), its interval at the confidence
asked, and a two-sided p-value for "no difference". A `None` interval means the method cannot
reach that confidence from so few pairs (`min_pairs_for`): its smallest p-value is above it.

What each assumes about the differences (independent across seeds in every case):
- t: their mean is normally distributed (the differences roughly normal; a t interval is
  robust to mild skew, not to one wild seed). The only one of the three that can reach 95%
  from 3-5 pairs.
- wilcoxon: symmetric about their center (no normality); exact from 6 pairs at 95%.
- sign: nothing more (the median of a continuous distribution); exact from 6 pairs at 95%.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from schedlab.runs.bootstrap import Interval

#: the paired methods, by name
TESTS = ("t", "wilcoxon", "sign")
#: what each method's estimate is (the statistic a row shows)
ESTIMATE = {"t": "mean", "wilcoxon": "pseudo-median", "sign": "median"}
#: enumerate every sign pattern up to this many nonzero differences; a normal approximation
#: (with the tie correction) above
_EXACT_MAX = 16


@dataclass(frozen=True, slots=True)
class TestResult:
    """One paired test: its estimate, interval (None: unreachable) and p-value (None: t from
    one pair)."""

    estimate: float
    ci: Interval | None
    p_value: float | None


def min_pairs_for(method: str, confidence: float) -> int:
    """The fewest pairs at which `method` can reach `confidence`: 2 for t (one degree of
    freedom); for the exact rank tests the smallest n with 2 * 0.5**n <= 1 - confidence (6 at
    0.95, 5 at 0.90, 8 at 0.99)."""
    if method == "t":
        return 2
    return max(2, math.ceil(math.log2(2.0 / (1.0 - confidence)) - 1e-9))


def paired_test(method: str, d: np.ndarray, confidence: float) -> TestResult:
    """Run `method` ("t", "wilcoxon" or "sign") on the differences `d` (at least 1)."""
    d = np.asarray(d, dtype=float)
    if method == "t":
        return t_test(d, confidence)
    if method == "wilcoxon":
        return wilcoxon_test(d, confidence)
    if method == "sign":
        return sign_test(d, confidence)
    raise ValueError(f"method {method!r} is not one of {', '.join(TESTS)}")


# ---- paired t -------------------------------------------------------------------------------
def t_test(d: np.ndarray, confidence: float) -> TestResult:
    """Mean of `d` with its t interval (n - 1 degrees of freedom) and the t test's p-value."""
    n, mean = len(d), float(np.mean(d))
    if n < 2:
        return TestResult(mean, None, None)
    sd = float(np.std(d, ddof=1))
    if sd == 0.0:  # every pair moved by the same amount: no noise to test against
        return TestResult(mean, Interval(mean, mean), 1.0 if mean == 0.0 else 0.0)
    se = sd / math.sqrt(n)
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * se
    p = 2.0 * t_sf(abs(mean) / se, n - 1)
    return TestResult(mean, Interval(mean - half, mean + half), min(1.0, p))


def t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom, t >= 0."""
    return 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(q: float, df: int) -> float:
    """The q-quantile (q in (0.5, 1)) of Student's t, by bisection on `t_sf`."""
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > 1.0 - q:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_sf(mid, df) > 1.0 - q else (lo, mid)
    return 0.5 * (lo + hi)


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (Lentz's continued fraction)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _betainc(b, a, 1.0 - x)
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, dd = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    dd = 1.0 / (dd if abs(dd) > tiny else tiny)
    f = dd
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            dd = 1.0 + num * dd
            dd = 1.0 / (dd if abs(dd) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * dd
        if abs(c * dd - 1.0) < 1e-15:
            break
    return front * f


# ---- Wilcoxon signed-rank ---------------------------------------------------------------------
def wilcoxon_test(d: np.ndarray, confidence: float) -> TestResult:
    """Hodges-Lehmann estimate (median of the Walsh averages) with its exact interval, and
    the exact two-sided signed-rank p-value (zero differences dropped, tied ranks averaged)."""
    n = len(d)
    walsh = np.sort([(d[i] + d[j]) / 2.0 for i in range(n) for j in range(i, n)])
    estimate = float(np.median(walsh))
    nz = d[d != 0.0]
    if len(nz) == 0:
        return TestResult(estimate, Interval(0.0, 0.0), 1.0)
    ranks = _midranks(np.abs(nz))
    w_plus = float(ranks[nz > 0].sum())
    if len(nz) <= _EXACT_MAX:
        signs = np.array(list(itertools.product((0.0, 1.0), repeat=len(nz))))
        dist = signs @ ranks
        mean = ranks.sum() / 2.0
        p = float(np.mean(np.abs(dist - mean) >= abs(w_plus - mean) - 1e-9))
    else:
        mean = ranks.sum() / 2.0
        sd = math.sqrt(float((ranks**2).sum()) / 4.0)
        p = 2.0 * (1.0 - NormalDist().cdf(max(abs(w_plus - mean) - 0.5, 0.0) / sd))
    if n < min_pairs_for("wilcoxon", confidence):
        return TestResult(estimate, None, min(1.0, p))
    # NOTE: the interval's order statistics come from the untied null distribution of n ranks
    k = _wilcoxon_k(n, 1.0 - confidence)
    ci = (Interval(float(walsh[k - 1]), float(walsh[len(walsh) - k])) if k is not None
          else None)
    return TestResult(estimate, ci, min(1.0, p))


def _midranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    sx = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sx[j + 1] == sx[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def _wilcoxon_k(n: int, alpha: float) -> int | None:
    """The largest k with P(W+ <= k - 1) <= alpha / 2 under the null (n untied ranks): the
    interval is the k-th smallest and k-th largest Walsh average; None when no k is."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for r in range(1, n + 1):
        counts[r:] = counts[r:] + counts[:-r].copy()
    cdf = np.cumsum(counts) / 2.0**n
    k = int(np.searchsorted(cdf, alpha / 2.0 + 1e-12, side="right"))
    return k if k >= 1 else None


# ---- sign test ------------------------------------------------------------------------------
def sign_test(d: np.ndarray, confidence: float) -> TestResult:
    """Median of `d` with its exact order-statistic interval, and the exact sign test's
    two-sided p-value (zero differences dropped)."""
    n, estimate = len(d), float(np.median(d))
    nz = d[d != 0.0]
    if len(nz) == 0:
        return TestResult(estimate, Interval(0.0, 0.0), 1.0)
    m, pos = len(nz), int((nz > 0).sum())
    tail = sum(math.comb(m, i) for i in range(min(pos, m - pos) + 1)) / 2.0**m
    p = min(1.0, 2.0 * tail)
    if n < min_pairs_for("sign", confidence):
        return TestResult(estimate, None, p)
    # the interval [d_(k), d_(n+1-k)] with the largest k such that P(B < k) <= alpha / 2
    alpha, k, below = 1.0 - confidence, 0, 0.0
    while below + math.comb(n, k) / 2.0**n <= alpha / 2.0:
        below += math.comb(n, k) / 2.0**n
        k += 1
    s = np.sort(d)
    ci = Interval(float(s[k - 1]), float(s[n - k])) if k >= 1 else None
    return TestResult(estimate, ci, p)
