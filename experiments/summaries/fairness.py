"""Fairness between clients: FCFS vs VTC vs a per-client rate limit, two heavy clients (both
backlogged: the case VTC's service-difference bound is about) and light ones (VTC, OSDI'24).

Clients are grouped by their id without its trailing number (`light0`, `light1` -> `light`).
Besides the per-policy table, the write-up has one row per policy and client group: the
group's median over seeds with its interval, and its paired ratio to FCFS (paired t over the
seeds, `schedlab.runs.metric_diff.diff_metric`, the default of `schedlab compare`).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from schedlab.runs.groups import jain_index
from schedlab.runs.metric_diff import diff_metric
from schedlab.runs.plots import new_figure

from .common import (
    CONFIDENCE,
    Metric,
    Spec,
    find,
    median_ci,
    median_text,
    paired_ratio,
    save,
    values,
)

QUEUE = "queue.name"
HEAVY, MEDIUM = "heavy", "medium"  # the two backlogged clients
POLICIES = ["fcfs", "vtc", "rate_limit"]


def group_of(client: str) -> str:
    """`light0` -> `light`: a client's group is its id without a trailing number."""
    return re.sub(r"\d+$", "", client) or client


def _clients(run) -> dict:
    return run.metrics.get("per_client") or {}


def group_value(run, group: str, key: str) -> float | None:
    """The mean over the group's clients of one per-client metric."""
    vs = [g[key] for c, g in _clients(run).items()
          if group_of(c) == group and isinstance(g.get(key), int | float)]
    return statistics.fmean(vs) if vs else None


def light_mean_ttft(run) -> float | None:
    """Mean over the light clients of their mean TTFT (ms)."""
    return group_value(run, "light", "mean_ttft_ms")


def light_p99_ttft(run) -> float | None:
    """The worst light client's p99 TTFT (ms)."""
    ls = [g["p99_ttft_ms"] for c, g in _clients(run).items() if group_of(c) == "light"]
    return max(ls) if ls else None


def heavy_mean_ttft(run) -> float | None:
    return group_value(run, HEAVY, "mean_ttft_ms")


def rejected_pct(run, group: str) -> float | None:
    gs = [g for c, g in _clients(run).items() if group_of(c) == group]
    n = sum(g.get("num_requests") or 0 for g in gs)
    return 100.0 * sum(g.get("num_rejected") or 0 for g in gs) / n if n else None


def heavy_rejected_pct(run) -> float | None:
    return rejected_pct(run, HEAVY)


def _cumulative(run) -> tuple[list[float], dict[str, np.ndarray]]:
    """Bin end times and each client's service received up to then (weighted tokens)."""
    tl = run.metrics.get("service_timeline") or {}
    ts = list(tl.get("t_s") or [])
    if not ts:
        return [], {}
    return ts, {c: np.cumsum(np.asarray(v, dtype=float) * ts[0])
                for c, v in (tl.get("clients") or {}).items()}


def _first_half(run) -> dict[str, float]:
    """Service each client received in the first half of the run (the overload: arrivals
    outpace the engine there; the second half drains the backlog)."""
    ts, cum = _cumulative(run)
    half = len(ts) // 2
    return {c: float(v[half - 1]) for c, v in cum.items()} if half else {}


def share_pct(run, group: str) -> float | None:
    """The group's share of the first half's service (%)."""
    s = _first_half(run)
    total = sum(s.values())
    return 100.0 * sum(v for c, v in s.items() if group_of(c) == group) / total if total else None


def heavy_share_pct(run) -> float | None:
    return share_pct(run, HEAVY)


def backlogged_gap(run) -> float | None:
    """The largest difference, over the first half's bins, between the service the two
    backlogged clients (heavy, medium) had received so far (weighted tokens): VTC keeps it
    bounded, FCFS lets it grow with the difference of their arrival rates."""
    ts, cum = _cumulative(run)
    half = len(ts) // 2
    if HEAVY not in cum or MEDIUM not in cum or not half:
        return None
    return float(np.max(np.abs(cum[HEAVY][:half] - cum[MEDIUM][:half])))


def first_half_jain(run) -> float | None:
    return jain_index(_first_half(run).values()) if _first_half(run) else None


# ---- the per-client-group table ----------------------------------------------------------------
GROUP_METRICS = (("mean_ttft_ms", "mean TTFT (ms)", ".0f"), ("p99_ttft_ms", "p99 TTFT (ms)",
                                                             ".0f"))


def _groups(rows: list) -> list[str]:
    seen: dict[str, None] = {}
    for row in rows:
        for run in row.runs:
            seen.update((group_of(c), None) for c in _clients(run))
    order = [g for g in (HEAVY, MEDIUM, "light") if g in seen]
    return order + [g for g in seen if g not in order]


def _stat(xs: list[float | None], fmt: str) -> str:
    vals = [x for x in xs if x is not None]
    return median_text(vals, fmt)[0] if vals else "-"


def _vs_fcfs(row, base, get) -> str:
    """Paired (by seed) t ratio of the row to FCFS: 'ratio [interval], p'."""
    if base is None or row is base:
        return "-"
    by_seed = {r.config.get("seed"): r for r in base.runs}
    pairs = [(get(by_seed[r.config.get("seed")]), get(r)) for r in row.runs
             if r.config.get("seed") in by_seed]
    m = diff_metric("x", [b for b, _ in pairs], [c for _, c in pairs], CONFIDENCE)
    if m.ratio is None:
        return "-"
    ci = f" [{m.ratio_ci.lo:.3g}, {m.ratio_ci.hi:.3g}]" if m.ratio_ci else ""
    p = "" if m.p_value is None else (", p<0.001" if m.p_value < 0.001 else f", p={m.p_value:.3f}")
    return f"{m.ratio:.3g}x{ci}{p}" + ("" if m.significant else f" ({m.verdict})")


def group_sections(rows: list, runs: Sequence) -> list[str]:
    policies = [q for q in [*POLICIES, *values(rows, QUEUE)] if find(rows, {QUEUE: q})]
    policies = list(dict.fromkeys(policies))
    base = find(rows, {QUEUE: "fcfs"})
    head = ["policy", "client group", "clients", "requests", "rejected (%)",
            "share of 1st-half service (%)", *(label for _, label, _ in GROUP_METRICS),
            "mean TTFT / FCFS (paired t)"]
    lines = ["## Per client group", "",
             "Each cell: median over seeds [95% percentile bootstrap interval of the median]; "
             "a group's value in one run is the mean over its clients. The last column is the "
             "geometric mean over seeds of the group's mean TTFT / FCFS's, with its 95% paired "
             "t interval and p-value (`schedlab compare`'s default; from 2 seeds on).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for q in policies:
        row = find(rows, {QUEUE: q})
        for g in _groups(rows):
            rs = [r for r in row.runs if any(group_of(c) == g for c in _clients(r))]
            if not rs:
                continue
            n_clients = max(sum(group_of(c) == g for c in _clients(r)) for r in rs)
            reqs = [sum((v.get("num_requests") or 0) for c, v in _clients(r).items()
                        if group_of(c) == g) for r in rs]
            cells = [q, g, str(n_clients), _stat(reqs, ".0f"),
                     _stat([rejected_pct(r, g) for r in rs], ".0f"),
                     _stat([share_pct(r, g) for r in rs], ".0f"),
                     *(_stat([group_value(r, g, k) for r in rs], fmt)
                       for k, _, fmt in GROUP_METRICS),
                     _vs_fcfs(row, base, lambda r, g=g: group_value(r, g, "mean_ttft_ms"))]
            lines.append("| " + " | ".join(cells) + " |")
    return [*lines, "", *_result_keys(policies, rows)]


#: fairness metrics of results.json shown when the runs have them (label, format)
RESULT_KEYS = (("max_service_difference", "max service difference between backlogged clients",
                ".0f"),
               ("jain_fairness_index", "Jain's index", ".3f"))


def _result_keys(policies: list, rows: list) -> list[str]:
    """A table of RESULT_KEYS per policy (median over seeds [interval]), where present."""
    keys = [(k, label, fmt) for k, label, fmt in RESULT_KEYS
            if any(r.metrics.get(k) is not None for row in rows for r in row.runs)]
    if not keys:
        return []
    head = ["policy", *(f"{label} (`{k}`)" for k, label, _ in keys)]
    lines = ["## Fairness metrics of results.json", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for q in policies:
        row = find(rows, {QUEUE: q})
        lines.append("| " + " | ".join([q, *(_stat([r.metrics.get(k) for r in row.runs], fmt)
                                             for k, _, fmt in keys)]) + " |")
    return [*lines, ""]


def fairness_notes(rows: list, runs: Sequence) -> list[str]:
    fcfs, vtc, rl = (find(rows, {QUEUE: q}) for q in POLICIES)
    out = []
    if fcfs is not None and vtc is not None:
        out.append(f"light clients' mean TTFT, FCFS / VTC: "
                   f"{paired_ratio(fcfs, vtc, '', light_mean_ttft)}; heavy client's mean TTFT "
                   f"VTC / FCFS: {paired_ratio(vtc, fcfs, '', heavy_mean_ttft)}")
        out.append(f"output throughput VTC / FCFS: "
                   f"{paired_ratio(vtc, fcfs, 'output_throughput')} (VTC is work-conserving: "
                   "it reorders, it does not hold back)")
        if vtc.get("backlogged_gap") is not None and fcfs.get("backlogged_gap") is not None:
            out.append(f"largest service gap between the two backlogged clients ({HEAVY}, "
                       f"{MEDIUM}) in the first half, VTC / FCFS: "
                       f"{paired_ratio(vtc, fcfs, '', backlogged_gap)} (VTC's bounded "
                       "service difference; FCFS serves them in proportion to their rates)")
    if rl is not None and vtc is not None and rl.get("heavy_rejected_pct") is not None:
        out.append(f"rate limit: {rl.get('heavy_rejected_pct'):.0f}% of the heavy client's "
                   f"requests rejected; output throughput rate limit / VTC "
                   f"{paired_ratio(rl, vtc, 'output_throughput')}; light mean TTFT "
                   f"rate limit / VTC {paired_ratio(rl, vtc, '', light_mean_ttft)}")
    return out


def fairness_figure(rows: list, path: Path, title: str) -> None:
    policies = [q for q in POLICIES if find(rows, {QUEUE: q}) is not None]
    policies += [q for q in values(rows, QUEUE) if q not in policies]
    groups = _groups(rows)
    fig, axes = new_figure(len(policies) + 1, 1, size=(3.4, 3.2))
    top = 0.0
    colors = {}
    for ax, q in zip(axes, policies, strict=False):
        row = find(rows, {QUEUE: q})
        run = min(row.runs, key=lambda r: r.config.get("seed") or 0)  # the first seed
        ts, cum = _cumulative(run)
        for c, v in sorted(cum.items()):
            g = group_of(c)
            colors.setdefault(g, f"C{len(colors) % 10}")
            ax.plot([0.0, *ts], [0.0, *v], "-" if g != "light" else "--", color=colors[g],
                    lw=1.8 if g != "light" else 1.0, label=c)
            top = max(top, float(v[-1]) if len(v) else 0.0)
        ax.set(xlabel="time (s)", ylabel="service so far (weighted tokens)",
               title=f"{q} (seed {run.config.get('seed')})")
    for ax in axes[:len(policies)]:
        ax.set_ylim(0, top * 1.05 or 1)
    ax = axes[len(policies)]
    width = 0.8 / max(len(groups), 1)
    for i, g in enumerate(groups):
        meds, errs = [], [[], []]
        for q in policies:
            xs = [group_value(r, g, "mean_ttft_ms") for r in find(rows, {QUEUE: q}).runs]
            xs = [x for x in xs if x is not None]
            med = statistics.median(xs) if xs else 0.0
            lo, hi = median_ci(xs) if len(xs) > 1 else (med, med)
            meds.append(med)
            errs[0].append(med - lo)
            errs[1].append(hi - med)
        ax.bar([x + (i - (len(groups) - 1) / 2) * width for x in range(len(policies))], meds,
               width, yerr=errs, capsize=2, label=g, color=colors.get(g, f"C{i}"))
    ax.set_xticks(list(range(len(policies))), policies)
    ax.set_yscale("log")
    ax.set(ylabel="mean TTFT (ms), median over seeds", title="TTFT by client group (log)")
    save(fig, axes, path, title)


FAIRNESS = Spec(
    name="fairness",
    title="Fairness between clients: FCFS vs VTC vs a rate limit",
    claim=("VTC (Sheng et al., OSDI'24): serving the client with the least service so far "
           "(a virtual token counter) isolates well-behaved clients from heavy ones (their "
           "latency stays low while the heavy clients are backlogged), keeps the service "
           "difference between two backlogged clients bounded (the paper's 2x bound), and "
           "stays work-conserving, unlike a per-client rate "
           "limit (RPM), which rejects requests and leaves capacity idle."),
    params=((QUEUE, "policy"),),
    metrics=(Metric("output_throughput", "output tok/s"),
             Metric("num_rejected", "rejected", ".0f"),
             Metric("heavy_rejected_pct", "heavy rejected (%)", ".0f", heavy_rejected_pct),
             Metric("light_mean_ttft_ms", "light mean TTFT (ms)", ".0f", light_mean_ttft),
             Metric("light_p99_ttft_ms", "light p99 TTFT (ms)", ".0f", light_p99_ttft),
             Metric("heavy_mean_ttft_ms", "heavy mean TTFT (ms)", ".0f", heavy_mean_ttft),
             Metric("heavy_share_pct", "heavy share, 1st half (%)", ".0f", heavy_share_pct),
             Metric("backlogged_gap", "heavy-medium service gap, 1st half", ".0f",
                    backlogged_gap),
             Metric("first_half_jain", "Jain, 1st half", ".3f", first_half_jain)),
    figure=fairness_figure, notes=fairness_notes, sections=group_sections,
    hidden=("queue.options",),  # each policy's own options
    order={QUEUE: POLICIES},
)
