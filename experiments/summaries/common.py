"""What every experiment summary shares: the Spec, derived per-run values, row helpers, plots.

`summarize.py` groups the runs of a sweep into rows (one per point, its seeds aggregated) and
hands them to a Spec. A row has `params` (config key -> value), `runs` (the RunRecords of its
seeds) and `stats` (metric key -> Stat with median, lo, hi (its bootstrap interval), n, min,
max). No Hydra, no engine.

Every interval published with an experiment is `median_ci`: a percentile bootstrap interval of
the median over seeds, seeded, so a rerun over the same results gives the same table.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedlab.runs.bootstrap import bootstrap_ci, min_pairs

Getter = Callable[[Any], float | None]
#: the request rate of Poisson arrivals (req/s), swept by the online experiments
RATE = "workload.arrival.rate"
#: the published intervals: level, bootstrap resamples and the generator's seed
CONFIDENCE, RESAMPLES, BOOT_SEED = 0.95, 10_000, 0
INTERVAL = (f"{100 * CONFIDENCE:g}% percentile bootstrap interval of the median, "
            f"{RESAMPLES} resamples")
#: with this many seeds or fewer, INTERVAL is exactly the min-max range
MINMAX_SEEDS = 5


def median_ci(xs: Sequence[float]) -> tuple[float, float]:
    """The published interval of the median of `xs` (at least 2 values): percentile
    bootstrap at CONFIDENCE, RESAMPLES resamples, seeded (percentile rather than BCa: BCa's
    jackknife acceleration is unreliable for a median)."""
    ci = bootstrap_ci(xs, "median", CONFIDENCE, RESAMPLES, "percentile", BOOT_SEED)
    return ci.lo, ci.hi


@dataclass(frozen=True, slots=True)
class Metric:
    """A table column: a results.json key, or a value derived from one run."""

    key: str
    label: str
    fmt: str = ".1f"
    derive: Getter | None = None

    def value(self, run: Any) -> float | None:
        v = self.derive(run) if self.derive is not None else run.metrics.get(self.key)
        return None if v is None or isinstance(v, bool) else float(v)


@dataclass(frozen=True, slots=True)
class Spec:
    """One experiment: the paper's claim and how its sweep is tabulated and drawn."""

    name: str
    title: str
    claim: str
    params: tuple[tuple[str, str], ...]  # (config key, column label), in table order
    metrics: tuple[Metric, ...]
    figure: Callable[[list, Path, str], None]
    notes: Callable[[list, Sequence], list[str]]
    hidden: tuple[str, ...] = ()  # swept keys implied by the params (not shown)
    order: dict[str, list[Any]] = field(default_factory=dict)  # categorical orders
    #: markdown lines after the main table (more tables), from the rows and runs
    sections: Callable[[list, Sequence], list[str]] | None = None


# ---- derived per-run values --------------------------------------------------------------
def output_len_cv(run: Any) -> float | None:
    lens = run.metrics.get("output_lens") or []
    if len(lens) < 2 or statistics.fmean(lens) == 0:
        return None
    return statistics.pstdev(lens) / statistics.fmean(lens)


def normalized_latency_ms(run: Any) -> float | None:
    """Orca's normalized latency: mean over requests of E2E latency / output tokens (ms)."""
    pairs = [(e, n) for e, n in zip(run.metrics.get("e2els") or [],
                                    run.metrics.get("output_lens") or [], strict=False) if n]
    return 1000.0 * statistics.fmean(e / n for e, n in pairs) if pairs else None


def _pool_tokens(run: Any) -> float | None:
    blocks, bs = run.metrics.get("num_kv_blocks"), run.config.get("engine.block_size")
    return float(blocks * bs) if blocks and bs else None


def kv_token_pct(run: Any) -> float | None:
    """Share of the KV pool holding token state, averaged over steps."""
    pool = _pool_tokens(run)
    used = run.metrics.get("mean_kv_used_tokens")
    return 100.0 * used / pool if pool and used is not None else None


def kv_reserved_pct(run: Any) -> float | None:
    """Share of the KV pool reserved by running requests, averaged over steps."""
    pool = _pool_tokens(run)
    res = run.metrics.get("mean_kv_reserved_tokens")
    return 100.0 * res / pool if pool and res is not None else None


def kv_used_of_reserved(run: Any) -> float | None:
    waste = run.metrics.get("kv_waste_pct")
    return None if waste is None else 100.0 - waste


# ---- helpers over rows -------------------------------------------------------------------
def rows_where(rows: list, key: str, value: Any) -> list:
    return [r for r in rows if r.params.get(key) == value]


def values(rows: list, key: str) -> list:
    seen: list = []
    for r in rows:
        if r.params.get(key) not in seen:
            seen.append(r.params.get(key))
    return seen


def median_text(xs: Sequence[float], fmt: str, unit: str = "") -> tuple[str, float, float]:
    """'median [interval]' of `xs` (the interval left out over one value or where it rounds to
    the median), with the interval's ends (`median_ci`; both the median below two values)."""
    med = statistics.median(xs)
    if len(xs) < 2:
        return f"{med:{fmt}}{unit}", med, med
    lo, hi = median_ci(xs)
    if f"{lo:{fmt}}" == f"{hi:{fmt}}":
        return f"{med:{fmt}}{unit}", lo, hi
    return f"{med:{fmt}}{unit} [{lo:{fmt}}, {hi:{fmt}}]", lo, hi


def paired_ratio(a: Any, b: Any, metric: str, derive: Getter | None = None) -> str:
    """a / b of a metric, paired seed by seed: 'median x [interval]' ('-' if no pair).

    The interval is `median_ci` of the per-seed ratios; from `min_pairs` seeds on (6 at 95%)
    an interval that covers 1 is marked "not significant".
    """
    get = derive or (lambda run: run.metrics.get(metric))
    b_by_seed = {run.config.get("seed"): get(run) for run in b.runs}
    ratios = []
    for run in a.runs:
        va, vb = get(run), b_by_seed.get(run.config.get("seed"))
        if va is not None and vb:
            ratios.append(va / vb)
    ratios = [r for r in ratios if math.isfinite(r)]
    if not ratios:
        return "-"
    text, lo, hi = median_text(ratios, ".2f", "x")
    if len(ratios) >= min_pairs(CONFIDENCE) and lo <= 1.0 <= hi:
        text += " (not significant)"
    return text


def find(rows: list, params: dict[str, Any]) -> Any | None:
    """The row with these parameter values (None if the sweep has none)."""
    for r in rows:
        if all(r.params.get(k) == v for k, v in params.items()):
            return r
    return None


def config_value(runs: Sequence, key: str, default: Any = None) -> Any:
    v = runs[0].config.get(key, default) if runs else default
    if isinstance(v, str) and v.startswith("["):
        return json.loads(v)
    return default if v is None else v


def line(ax: Any, rows: list, x: str, y: str, label: str, style: str = "o-",
          x_metric: bool = False, color: str | None = None) -> None:
    """Medians joined by a line, their intervals as error bars; x is a param or (x_metric) a
    metric."""
    pts = []
    for r in rows:
        xv = r.stats[x].median if x_metric else r.params.get(x)
        s = r.stats[y]
        if xv is None or s.median is None:
            continue
        pts.append((float(xv), s.median, s.median - s.lo, s.hi - s.median))
    if not pts:
        return
    pts.sort()
    ax.errorbar([p[0] for p in pts], [p[1] for p in pts],
                yerr=[[p[2] for p in pts], [p[3] for p in pts]], fmt=style, capsize=3,
                label=label, markersize=4, color=color)


def save(fig: Any, axes: list, path: Path, title: str) -> None:
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
