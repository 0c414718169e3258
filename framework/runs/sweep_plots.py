"""`tradeoff.png` of `schedlab report`: one point per configuration (the median over its
seeds, bars its 95% percentile bootstrap interval, which is the range at 5 seeds or fewer), so
seeds are never drawn as a line.

The last numeric swept key (an arrival rate) joins its points in order and labels them; every
combination of the other keys (a policy name) gets a colour, named in a legend outside the axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from schedlab.runs.bootstrap import bootstrap_ci
from schedlab.runs.plots import new_figure
from schedlab.runs.report_tables import configurations, median

#: (x metric, y metric, x label, y label) of each panel
PANELS = (("output_throughput", "p99_tpot_ms", "output throughput (tok/s)", "P99 TPOT (ms)"),
          ("request_throughput", "p99_ttft_ms", "request throughput (req/s)", "P99 TTFT (ms)"))


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _summary(members: Sequence[Any], key: str) -> tuple[float, float, float] | None:
    """Median over the seeds and its 95% percentile bootstrap interval (seeded)."""
    xs = [r.metrics.get(key) for r in members]
    xs = [float(x) for x in xs if _number(x)]
    if not xs:
        return None
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    ci = bootstrap_ci(xs, "median", resamples=2000, seed=0)
    mid = median(xs)
    assert mid is not None, "xs holds numbers"
    return mid, ci.lo, ci.hi


def tradeoff_plot(runs: Sequence[Any], point: Sequence[str], path: Path) -> Path:
    """Draw the trade-off panels for the configurations of `point` (swept keys, no seed).

    Returns:
        `path`.
    """
    numeric = [p for p in point if all(_number(r.config.get(p)) for r in runs)][-1:]
    categorical = [p for p in point if p not in numeric]  # one colour per combination
    configs = configurations(runs, point)
    seeds = max(len(m) for _, m in configs)
    series: dict[str, list[tuple[dict, list]]] = {}
    for values, members in configs:
        label = ", ".join(str(values[p]) if len(categorical) == 1 else f"{_short(p)}={values[p]}"
                          for p in categorical) or "runs"
        series.setdefault(label, []).append((values, members))
    fig, axes = new_figure(2, 1, size=(4.6, 3.8))
    for ax, (xk, yk, xl, yl) in zip(axes, PANELS, strict=True):
        for i, (label, members) in enumerate(series.items()):
            pts = []
            for values, runs_ in members:
                x, y = _summary(runs_, xk), _summary(runs_, yk)
                if x is not None and y is not None:
                    pts.append((tuple(values[p] for p in numeric), x, y))
            pts.sort(key=lambda p: p[0])
            if not pts:
                continue
            ax.errorbar([p[1][0] for p in pts], [p[2][0] for p in pts],
                        xerr=[[p[1][0] - p[1][1] for p in pts], [p[1][2] - p[1][0] for p in pts]],
                        yerr=[[p[2][0] - p[2][1] for p in pts], [p[2][2] - p[2][0] for p in pts]],
                        fmt="o-" if numeric else "o", ms=5, capsize=3, lw=1.2, color=f"C{i % 10}",
                        label=label if ax is axes[0] else None)
            if numeric:
                for key, x, y in pts:
                    ax.annotate(", ".join(str(v) for v in key), (x[0], y[0]), fontsize=7,
                                xytext=(4, 4), textcoords="offset points", color=f"C{i % 10}")
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
    if len(series) > 1:
        title = categorical[0] if len(categorical) == 1 else None
        fig.legend(loc="outside right upper", fontsize=8, title=title, title_fontsize=8)
    what = (f"median of {seeds} seeds, bars: 95% bootstrap interval of the median"
            + (", the range at 5 seeds or fewer" if seeds <= 5 else "")
            if seeds > 1 else "one run each")
    along = f"; labels: {', '.join(_short(p) for p in numeric)}" if numeric else ""
    fig.suptitle(f"{len(configs)} configurations ({what}{along})", fontsize=10)
    fig.savefig(path, dpi=110)
    return path
