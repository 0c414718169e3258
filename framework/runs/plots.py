"""Plots of one run: latency CDFs, the engine's KV use, batch and queue over time, and for a
run with clients the service each received and its TTFT CDF.

Figures are drawn with matplotlib's object API on the Agg canvas, so no global backend is
switched and nothing needs a display.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

from schedlab.runs.run_result import RunResult
from schedlab.stats import StepStats

PLOTS_DIR = "plots"


def new_figure(ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (6.0, 4.0)):
    """A figure with an Agg canvas and its axes (a flat list)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(size[0] * ncols, size[1] * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def write_plots(run_dir: Path, run: RunResult, metrics: dict,
                steps: Iterable[StepStats] | None = None) -> list[Path]:
    """Write `run_dir/plots/latency_cdf.png` (a run with per-request lists), `timeline.png`
    and, for a run whose requests carry client ids, `clients.png`.

    Args:
        run_dir: the run's output directory.
        run: the run (its step series feeds the timeline, its requests or, streaming, their
            stats the per-client CDFs).
        metrics: `compute_metrics(run)` (its per-request lists feed the CDFs, its
            `service_timeline` the per-client service).
        steps: the run's steps, read once, when it did not keep them (streaming:
            steps.csv read back); None: `run.step_stats`.

    Returns:
        The PNG paths written.
    """
    out = Path(run_dir) / PLOTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    paths = [_timeline(out / "timeline.png", run, run.step_stats if steps is None else steps)]
    if "ttfts" in metrics:  # NOTE: a streaming run (`driver.save_detailed=false`) has no lists
        paths.insert(0, _latency_cdfs(out / "latency_cdf.png", metrics))
    if metrics.get("per_client"):
        paths.append(_clients(out / "clients.png", run, metrics))
    return paths


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


def _cdf(ax, values: Sequence[float], name: str, label: str | None = None,
         marks: bool = True) -> None:
    ax.set_title(name)
    ax.set_xlabel(f"{name} (ms)")
    ax.set_ylabel("fraction of requests" if name == "TTFT" else "fraction of samples")
    ax.grid(alpha=0.3)
    if not len(values):
        if marks:
            ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
        return
    x = np.sort(np.asarray(values, dtype=float) * 1000.0)
    y = np.arange(1, len(x) + 1) / len(x)
    ax.step(x, y, where="post", label=label)
    if marks:
        for q in (50, 99):
            v = float(np.percentile(x, q))
            ax.axvline(v, ls="--", lw=0.8, color="gray")
            ax.annotate(f"p{q}", (v, 0.02), fontsize=8, color="gray")
    ax.set_ylim(0, 1.02)


#: the `StepStats` fields the timeline draws
TIMELINE_FIELDS = ("time", "kv_reserved_tokens", "kv_used_tokens", "num_running",
                   "num_scheduled_seqs", "num_waiting", "num_preempted")


def _timeline(path: Path, run: RunResult, steps: Iterable[StepStats]) -> Path:
    """KV slots (reserved, holding tokens; the pool's share on the right axis), the batch
    (running and scheduled requests) and the queue (waiting requests, preemptions), each on
    its own scale."""
    from matplotlib.ticker import MaxNLocator

    # NOTE: the columns drawn, read in one pass (no record kept)
    cols: list[list[Any]] = [[] for _ in TIMELINE_FIELDS]
    adds = [c.append for c in cols]
    get = attrgetter(*TIMELINE_FIELDS)
    for s in steps:
        for add, v in zip(adds, get(s), strict=True):
            add(v)
    times, reserved_c, used_c, running, scheduled, waiting, preempted = cols
    t = np.asarray(times, dtype=float) - run.start_time if times else np.asarray([], float)
    fig, (kv_ax, batch_ax, queue_ax) = new_figure(3, 1, size=(4.2, 3.2))
    if times:
        pool = run.num_kv_blocks * max(run.block_size, 1)
        reserved = np.asarray(reserved_c, dtype=float)
        used = np.asarray(used_c, dtype=float)
        kv_ax.fill_between(t, reserved, step="post", alpha=0.3, color="C0",
                           label="reserved slots")
        kv_ax.step(t, used, where="post", color="C1", lw=1.2, label="slots holding tokens")
        top = max(float(reserved.max()), float(used.max()), 1.0) * 1.1
        if pool:
            share = kv_ax.twinx()
            share.set_ylim(0, 100.0 * top * 1.15 / pool)
            share.set_ylabel("% of the KV pool")
            kv_ax.set_title(f"KV cache (pool: {pool:,} slots, peak "
                            f"{100.0 * max(reserved.max(), used.max()) / pool:.1f}%)")
        batch_ax.step(t, running, where="post", color="C2", lw=2.5, alpha=0.5,
                      label="running")
        batch_ax.step(t, scheduled, where="post", color="k",
                      lw=0.9, ls="--", label="scheduled this step")
        queue_ax.step(t, waiting, where="post", color="C3",
                      label="waiting")
        pre = [i for i, p in enumerate(preempted) if p]
        if pre:
            queue_ax.plot(t[pre], [waiting[i] for i in pre], "kx", ms=5,
                          label=f"preemption ({len(pre)} steps)")
        batch_ax.set_ylim(0, max(max(running), 1) * 1.4)  # room for the legend
        queue_ax.set_ylim(0, max(max(waiting), 1) * 1.25)
        kv_ax.set_ylim(0, top * 1.15)
        for ax in (kv_ax, batch_ax, queue_ax):
            ax.legend(fontsize=7, loc="upper right")
    if not kv_ax.get_title():
        kv_ax.set_title("KV cache")
    kv_ax.set_ylabel("token slots")
    batch_ax.set_title("Batch")
    batch_ax.set_ylabel("requests")
    queue_ax.set_title("Queue")
    queue_ax.set_ylabel("requests")
    for ax in (kv_ax, batch_ax, queue_ax):
        ax.set_xlabel("time (s)")
        ax.grid(alpha=0.3)
    for ax in (batch_ax, queue_ax):
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.savefig(path, dpi=100)
    return path


def _clients(path: Path, run: RunResult, metrics: dict[str, Any]) -> Path:
    """Per client: the service received so far (from `service_timeline`) and the TTFT CDF."""
    from schedlab.runs.groups import SERVICE_WEIGHTS, client_groups
    from schedlab.runs.request_stats import RequestStats

    tl = metrics.get("service_timeline") or {}
    names = list((metrics.get("per_client") or {}).keys())
    stats = run.stats if run.stats is not None else RequestStats.of(run.requests,
                                                                     run.start_time)
    by_client = client_groups(stats)
    fig, (svc_ax, ttft_ax) = new_figure(2, 1, size=(4.6, 3.4))
    ts = list(tl.get("t_s") or [])
    width = ts[0] if ts else 0.0
    for i, c in enumerate(names):
        color = f"C{i % 10}"
        ttfts = stats.ttft[stats.completed_among(by_client[c])].tolist() if c in by_client else []
        label = f"{c} ({len(ttfts)} done)"
        rate = (tl.get("clients") or {}).get(c)
        if rate and ts:
            svc_ax.plot([0.0, *ts], [0.0, *np.cumsum(np.asarray(rate) * width)], color=color,
                        label=label)
        _cdf(ttft_ax, ttfts, "TTFT", marks=False)
        if ttft_ax.lines:
            ttft_ax.lines[-1].set_color(color)
    svc_ax.set(title="Service received so far", xlabel="time (s)",
               ylabel=f"weighted tokens (prompt x{SERVICE_WEIGHTS[0]:g}, output "
                      f"x{SERVICE_WEIGHTS[1]:g})")
    svc_ax.grid(alpha=0.3)
    svc_ax.set_ylim(bottom=0)
    ttft_ax.set_title("TTFT per client (completed requests)")
    if svc_ax.get_legend_handles_labels()[0]:
        fig.legend(loc="outside right upper", fontsize=8, title="client", title_fontsize=8)
    fig.savefig(path, dpi=100)
    return path
