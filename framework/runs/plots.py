"""Plots of one run: latency CDFs and the engine's KV use and batch size over time.

Figures are drawn with matplotlib's object API on the Agg canvas, so no global backend is
switched and nothing needs a display.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from schedlab.runs.run_result import RunResult

PLOTS_DIR = "plots"


def new_figure(ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (6.0, 4.0)):
    """A figure with an Agg canvas and its axes (a flat list)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(size[0] * ncols, size[1] * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def write_plots(run_dir: Path, run: RunResult, metrics: dict) -> list[Path]:
    """Write `run_dir/plots/latency_cdf.png` and `run_dir/plots/timeline.png`.

    Args:
        run_dir: the run's output directory.
        run: the run (its step series feeds the timeline).
        metrics: `compute_metrics(run)` (its per-request lists feed the CDFs).

    Returns:
        The PNG paths written.
    """
    out = Path(run_dir) / PLOTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    return [_latency_cdfs(out / "latency_cdf.png", metrics),
            _timeline(out / "timeline.png", run)]


def _latency_cdfs(path: Path, metrics: dict[str, Any]) -> Path:
    series = {
        "TTFT": metrics.get("ttfts", []),
        "TPOT": [t for t in metrics.get("tpots", []) if t is not None],
        "ITL": [g for gaps in metrics.get("itls", []) for g in gaps],
        "E2EL": metrics.get("e2els", []),
    }
    fig, axes = new_figure(2, 2, size=(5.0, 3.6))
    for ax, (name, values) in zip(axes, series.items(), strict=True):
        _cdf(ax, values, name)
    fig.suptitle(f"Latency CDFs ({metrics.get('completed', 0)} requests)")
    fig.savefig(path, dpi=100)
    return path


def _cdf(ax, values: Sequence[float], name: str) -> None:
    ax.set_title(name)
    ax.set_xlabel(f"{name} (ms)")
    ax.set_ylabel("fraction of samples")
    ax.grid(alpha=0.3)
    if not len(values):
        ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
        return
    x = np.sort(np.asarray(values, dtype=float) * 1000.0)
    y = np.arange(1, len(x) + 1) / len(x)
    ax.step(x, y, where="post")
    for q in (50, 99):
        v = float(np.percentile(x, q))
        ax.axvline(v, ls="--", lw=0.8, color="gray")
        ax.annotate(f"p{q}", (v, 0.02), fontsize=8, color="gray")
    ax.set_ylim(0, 1.02)


def _timeline(path: Path, run: RunResult) -> Path:
    steps = run.step_stats
    t = np.asarray([s.time - run.start_time for s in steps], dtype=float)
    fig, (kv_ax, batch_ax) = new_figure(1, 2, size=(9.0, 3.2))
    if steps:
        bs = max(run.block_size, 1)
        kv_ax.plot(t, [s.kv_reserved_tokens for s in steps], label="reserved slots")
        kv_ax.plot(t, [s.kv_used_tokens for s in steps], label="tokens held")
        if run.num_kv_blocks:
            kv_ax.axhline(run.num_kv_blocks * bs, ls="--", color="gray", label="pool capacity")
        batch_ax.plot(t, [s.num_scheduled_seqs for s in steps], label="scheduled seqs")
        batch_ax.plot(t, [s.num_running for s in steps], label="running")
        batch_ax.plot(t, [s.num_waiting for s in steps], label="waiting")
        pre = [i for i, s in enumerate(steps) if s.num_preempted]
        if pre:
            batch_ax.plot(t[pre], [steps[i].num_running for i in pre], "rx", label="preemption")
        kv_ax.legend(fontsize=8)
        batch_ax.legend(fontsize=8)
    kv_ax.set_title("KV cache")
    kv_ax.set_ylabel("token slots")
    batch_ax.set_title("Batch")
    batch_ax.set_ylabel("requests")
    for ax in (kv_ax, batch_ax):
        ax.set_xlabel("time (s)")
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=100)
    return path
