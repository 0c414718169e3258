"""Fairness between clients: FCFS vs VTC vs a per-client rate limit, one heavy client and
several light ones (VTC, OSDI'24)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from schedlab.runs.groups import jain_index
from schedlab.runs.plots import new_figure

from .common import Metric, Spec, find, paired_ratio, save, values

QUEUE = "queue.name"
HEAVY = "heavy"
POLICIES = ["fcfs", "vtc", "rate_limit"]


def _clients(run) -> dict:
    return run.metrics.get("per_client") or {}


def _light(run) -> list[dict]:
    return [g for c, g in _clients(run).items() if c != HEAVY]


def light_mean_ttft(run) -> float | None:
    """Mean over the light clients of their mean TTFT (ms)."""
    ls = _light(run)
    return statistics.fmean(g["mean_ttft_ms"] for g in ls) if ls else None


def light_p99_ttft(run) -> float | None:
    """The worst light client's p99 TTFT (ms)."""
    ls = _light(run)
    return max(g["p99_ttft_ms"] for g in ls) if ls else None


def heavy_mean_ttft(run) -> float | None:
    g = _clients(run).get(HEAVY)
    return None if g is None else g["mean_ttft_ms"]


def heavy_rejected_pct(run) -> float | None:
    g = _clients(run).get(HEAVY)
    return None if not g else 100.0 * g["num_rejected"] / g["num_requests"]


def _first_half(run) -> dict[str, float]:
    """Service each client received in the first half of the run (the overload: arrivals
    outpace the engine there; the second half drains the backlog)."""
    tl = run.metrics.get("service_timeline") or {}
    ts = tl.get("t_s") or []
    if not ts:
        return {}
    half, width = len(ts) // 2, ts[0]
    return {c: width * sum(v[:half]) for c, v in tl["clients"].items()}


def heavy_share_pct(run) -> float | None:
    """The heavy client's share of the service in the first half (%)."""
    s = _first_half(run)
    total = sum(s.values())
    return 100.0 * s.get(HEAVY, 0.0) / total if total else None


def light_service_gap(run) -> float | None:
    """The largest difference of first-half service between two light clients, relative to
    their mean (%): VTC's bounded service difference among clients below their share."""
    s = [v for c, v in _first_half(run).items() if c != HEAVY]
    return 100.0 * (max(s) - min(s)) / statistics.fmean(s) if len(s) > 1 and any(s) else None


def first_half_jain(run) -> float | None:
    return jain_index(_first_half(run).values()) if _first_half(run) else None


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
        if fcfs.get("heavy_share_pct") is not None and vtc.get("heavy_share_pct") is not None:
            out.append(f"heavy client's share of first-half service: FCFS "
                       f"{fcfs.get('heavy_share_pct'):.0f}%, VTC "
                       f"{vtc.get('heavy_share_pct'):.0f}%")
    if rl is not None and vtc is not None and rl.get("heavy_rejected_pct") is not None:
        out.append(f"rate limit: {rl.get('heavy_rejected_pct'):.0f}% of the heavy client's "
                   f"requests rejected; output throughput rate limit / VTC "
                   f"{paired_ratio(rl, vtc, 'output_throughput')}; light mean TTFT "
                   f"rate limit / VTC {paired_ratio(rl, vtc, '', light_mean_ttft)}")
    return out


def fairness_figure(rows: list, path: Path, title: str) -> None:
    policies = [q for q in POLICIES if find(rows, {QUEUE: q}) is not None]
    policies += [q for q in values(rows, QUEUE) if q not in policies]
    fig, axes = new_figure(len(policies) + 1, 1, size=(3.6, 3.2))
    top = 0.0
    for ax, q in zip(axes, policies, strict=False):
        row = find(rows, {QUEUE: q})
        run = min(row.runs, key=lambda r: r.config.get("seed") or 0)  # the first seed
        tl = run.metrics.get("service_timeline") or {}
        for c, v in sorted((tl.get("clients") or {}).items()):
            heavy = c == HEAVY
            ax.plot(tl["t_s"], v, "-" if heavy else "--", lw=2 if heavy else 1, label=c)
            top = max(top, max(v, default=0.0))
        ax.set(xlabel="time (s)", ylabel="service rate (weighted tok/s)",
               title=f"{q} (seed {run.config.get('seed')})")
    for ax in axes[:len(policies)]:
        ax.set_ylim(0, top * 1.05 or 1)
    ax = axes[len(policies)]
    xs = range(len(policies))
    meds = [[find(rows, {QUEUE: q}).stats[k].median or 0.0 for q in policies]
            for k in ("light_mean_ttft_ms", "heavy_mean_ttft_ms")]
    ax.bar([x - 0.2 for x in xs], meds[0], 0.4, label="light clients")
    ax.bar([x + 0.2 for x in xs], meds[1], 0.4, label="heavy client")
    ax.set_xticks(list(xs), policies)
    ax.set(ylabel="mean TTFT (ms), median over seeds", title="time to first token")
    save(fig, axes, path, title)


FAIRNESS = Spec(
    name="fairness",
    title="Fairness between a heavy client and light ones: FCFS vs VTC vs a rate limit",
    claim=("VTC (Sheng et al., OSDI'24): serving the client with the least service so far "
           "(a virtual token counter) isolates well-behaved clients from a heavy one (their "
           "latency stays low while the heavy client is backlogged), keeps the service "
           "difference between two backlogged clients within twice the largest weighted "
           "request, and stays work-conserving, unlike a per-client rate limit (RPM), which "
           "rejects requests and leaves capacity idle."),
    params=((QUEUE, "policy"),),
    metrics=(Metric("output_throughput", "output tok/s"),
             Metric("num_rejected", "rejected", ".0f"),
             Metric("heavy_rejected_pct", "heavy rejected (%)", ".0f", heavy_rejected_pct),
             Metric("light_mean_ttft_ms", "light mean TTFT (ms)", ".0f", light_mean_ttft),
             Metric("light_p99_ttft_ms", "light p99 TTFT (ms)", ".0f", light_p99_ttft),
             Metric("heavy_mean_ttft_ms", "heavy mean TTFT (ms)", ".0f", heavy_mean_ttft),
             Metric("heavy_share_pct", "heavy share, 1st half (%)", ".0f", heavy_share_pct),
             Metric("light_gap_pct", "light service gap (%)", ".0f", light_service_gap),
             Metric("first_half_jain", "Jain, 1st half", ".3f", first_half_jain)),
    figure=fairness_figure, notes=fairness_notes,
    hidden=("queue.options",),  # each policy's own options
    order={QUEUE: POLICIES},
)
