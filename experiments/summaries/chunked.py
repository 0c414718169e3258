"""Sarathi-Serve: chunked prefill under long prompts, capacity under a TBT SLO."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from schedlab.runs.plots import new_figure

from .common import (
    RATE,
    Metric,
    Spec,
    config_value,
    find,
    line,
    rows_where,
    save,
    values,
)

VARIANT = "exp.sched"


#: a rate counts only if the engine kept up with it: completed req/s >= this x the offered rate
KEEP_UP = 0.8


def capacity(rows: list, slo_ms: float, ttft_ms: float) -> tuple[float | None, bool]:
    """The largest rate at which the engine meets p99 ITL <= slo_ms and median TTFT <= ttft_ms
    and keeps up (completed req/s >= KEEP_UP x offered), medians over seeds; interpolated
    linearly between the last swept rate that meets all three (with every lower rate) and the
    first that does not.

    Returns:
        (rate, censored): rate None when even the lowest rate fails; censored True when the
        highest swept rate still meets all three (the capacity is at least that).
    """
    def excess(r: Any) -> list[float]:  # > 0: the criterion fails
        itl, ttft, done = r.get("p99_itl_ms"), r.get("median_ttft_ms"), r.get("request_throughput")
        if itl is None or ttft is None or done is None:
            return [math.inf]
        return [itl - slo_ms, ttft - ttft_ms, KEEP_UP - done / r.params[RATE]]

    prev = None
    for r in sorted(rows, key=lambda r: r.params[RATE]):
        g1 = excess(r)
        if all(g <= 0 for g in g1):
            prev = r
            continue
        if prev is None:
            return None, False
        (x0, x1), g0 = (prev.params[RATE], r.params[RATE]), excess(prev)
        cross = x1
        for a, b in zip(g0, g1, strict=True):
            if b > 0 and math.isfinite(b) and b > a:
                cross = min(cross, x0 + (x1 - x0) * (0 - a) / (b - a))
        return cross, False
    return (prev.params[RATE], True) if prev is not None else (None, False)


def chunked_notes(rows: list, runs: Sequence) -> list[str]:
    slos = config_value(runs, "exp.slo_tbt_ms", [])
    ttft = float(config_value(runs, "exp.slo_median_ttft_ms", math.inf))
    focus = config_value(runs, "exp.focus_rate")
    variants = values(rows, VARIANT)
    out = []
    lowest = min(values(rows, RATE))
    for slo in slos:
        caps = {v: capacity(rows_where(rows, VARIANT, v), slo, ttft) for v in variants}
        text = ", ".join(
            f"{v} " + (f"< {lowest:g}" if c is None else f"{'>= ' if cens else ''}{c:.1f}")
            + " req/s" for v, (c, cens) in caps.items())
        line = (f"capacity at p99 TBT (ITL) <= {slo:g} ms, median TTFT <= {ttft:g} ms and "
                f"completed >= {KEEP_UP:g} x offered: {text}")
        if len(variants) == 2 and all(c for c, _ in caps.values()):
            (a, ca), (b, cb) = (caps[v] for v in variants)
            bound = ">= " if cb and not ca else "<= " if ca and not cb else ""
            line += f" ({bound}{b / a:.2f}x)" if not (ca and cb) else " (both censored)"
        out.append(line)
    if focus is not None:
        for v in variants:
            r = find(rows, {VARIANT: v, RATE: focus})
            if r is not None:
                out.append(f"at {focus} req/s, {v}: p99 ITL {r.get('p99_itl_ms'):.1f} ms, "
                           f"p99 TPOT {r.get('p99_tpot_ms'):.1f} ms, median TTFT "
                           f"{r.get('median_ttft_ms'):.0f} ms, p99 TTFT "
                           f"{r.get('p99_ttft_ms'):.0f} ms")
    return out


def chunked_figure(rows: list, path: Path, title: str) -> None:
    fig, axes = new_figure(3, 1, size=(4.2, 3.8))
    runs = [run for r in rows for run in r.runs]
    for i, v in enumerate(values(rows, VARIANT)):
        sub, c = rows_where(rows, VARIANT, v), f"C{i}"
        line(axes[0], sub, RATE, "p99_itl_ms", str(v), color=c)
        line(axes[1], sub, RATE, "p99_tpot_ms", str(v), color=c)
        line(axes[2], sub, RATE, "median_ttft_ms", f"{v} median", color=c)
        line(axes[2], sub, RATE, "p99_ttft_ms", f"{v} p99", style="x--", color=c)
    for slo in config_value(runs, "exp.slo_tbt_ms", []):
        axes[0].axhline(slo, color="gray", ls=":", lw=1)
        axes[0].annotate(f"SLO {slo:g} ms", (axes[0].get_xlim()[0], slo), fontsize=7)
    ttft = config_value(runs, "exp.slo_median_ttft_ms")
    if ttft is not None:
        axes[2].axhline(ttft, color="gray", ls=":", lw=1)
    axes[0].set(xlabel="request rate (req/s)", ylabel="p99 ITL = TBT (ms)", yscale="log")
    axes[1].set(xlabel="request rate (req/s)", ylabel="p99 TPOT (ms)", yscale="log")
    axes[2].set(xlabel="request rate (req/s)", ylabel="TTFT (ms)", yscale="log")
    save(fig, axes, path, title)


CHUNKED = Spec(
    name="chunked_prefill",
    title="Chunked prefill under long prompts (Sarathi-Serve)",
    claim=("Sarathi-Serve (OSDI'24): splitting prefills into chunks that share a step with "
           "decodes ('stall-free batching') bounds the time between tokens; 2.6x the serving "
           "capacity of vLLM for Mistral-7B on one A100 under a P99 TBT SLO."),
    params=((VARIANT, "scheduler"), ("engine.max_num_batched_tokens", "token budget"),
            (RATE, "rate (req/s)")),
    metrics=(Metric("request_throughput", "req/s", ".2f"),
             Metric("median_itl_ms", "p50 ITL (ms)", ".1f"),
             Metric("p99_itl_ms", "p99 ITL (ms)", ".1f"),
             Metric("p99_tpot_ms", "p99 TPOT (ms)", ".1f"),
             Metric("median_ttft_ms", "p50 TTFT (ms)", ".0f"),
             Metric("p99_ttft_ms", "p99 TTFT (ms)", ".0f")),
    figure=chunked_figure, notes=chunked_notes,
    hidden=("scheduler",),
    order={VARIANT: ["continuous", "chunked"]},
)
