"""The latency-throughput trade-off over the request rate, with its knee."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from schedlab.runs.plots import new_figure

from .common import (
    RATE,
    Metric,
    Spec,
    line,
    rows_where,
    save,
    values,
)

CONC = "driver.max_concurrency"


def knee(rows: list) -> Any | None:
    """The load past which more offered load buys little throughput, only latency.

    Kneedle on achieved output throughput vs offered rate (a concave, saturating curve): both
    scaled to [0, 1], the knee is the point furthest above the chord from the lowest to the
    highest rate. None when the curve stays within 0.1 of the chord (no saturation swept).
    """
    pts = sorted((r for r in rows if r.get("output_throughput") is not None),
                 key=lambda r: r.params[RATE])
    if len(pts) < 3:
        return None
    xs = [float(r.params[RATE]) for r in pts]
    ys = [r.get("output_throughput") for r in pts]
    (x0, x1), (y0, y1) = (xs[0], xs[-1]), (min(ys), max(ys))
    if x1 <= x0 or y1 <= y0:
        return None
    scores = [(y - y0) / (y1 - y0) - (x - x0) / (x1 - x0) for x, y in zip(xs, ys, strict=True)]
    best = max(range(len(pts)), key=scores.__getitem__)
    return pts[best] if scores[best] > 0.1 else None


def latency_notes(rows: list, runs: Sequence) -> list[str]:
    out = []
    for conc in values(rows, CONC):
        sub = rows_where(rows, CONC, conc)
        k = knee(sub)
        top = max(sub, key=lambda r: r.get("output_throughput") or 0.0)
        name = f"max concurrency {'none' if conc is None else conc}"
        if k is None:
            out.append(f"{name}: no knee within the swept rates (throughput still grows with "
                       "the offered load)")
            continue
        share = 100 * k.get("output_throughput") / top.get("output_throughput")
        out.append(f"{name}: knee at {k.params[RATE]} req/s: {k.get('output_throughput'):.1f} "
                   f"output tok/s ({share:.0f}% of the most measured), p50 / p99 TTFT "
                   f"{k.get('median_ttft_ms'):.0f} / {k.get('p99_ttft_ms'):.0f} ms, p50 / p99 "
                   f"TPOT {k.get('median_tpot_ms'):.1f} / {k.get('p99_tpot_ms'):.1f} ms; "
                   f"at {top.params[RATE]} req/s: "
                   f"{top.get('output_throughput'):.1f} tok/s, p99 TTFT "
                   f"{top.get('p99_ttft_ms'):.0f} ms")
    return out


def latency_figure(rows: list, path: Path, title: str) -> None:
    fig, axes = new_figure(2, 1, size=(5.0, 3.8))
    for i, conc in enumerate(values(rows, CONC)):
        sub, c = rows_where(rows, CONC, conc), f"C{i}"
        tag = "no cap" if conc is None else f"cap {conc}"
        for ax, (p50, p99) in zip(axes, (("median_ttft_ms", "p99_ttft_ms"),
                                        ("median_tpot_ms", "p99_tpot_ms")), strict=True):
            line(ax, sub, "output_throughput", p50, f"p50, {tag}", x_metric=True, color=c)
            line(ax, sub, "output_throughput", p99, f"p99, {tag}", style="s--", x_metric=True,
                  color=c)
        for r in sorted(sub, key=lambda r: r.params[RATE]):
            axes[0].annotate(f"{r.params[RATE]:g}", (r.get("output_throughput"),
                                                     r.get("p99_ttft_ms")),
                             fontsize=6, xytext=(2, 2), textcoords="offset points")
        k = knee(sub)
        if k is not None:
            for ax, key in ((axes[0], "p99_ttft_ms"), (axes[1], "p99_tpot_ms")):
                ax.plot([k.get("output_throughput")], [k.get(key)], "*", markersize=15,
                        color=c, markeredgecolor="black",
                        label=f"knee ({tag}): {k.params[RATE]:g} req/s")
    axes[0].set(xlabel="output throughput (tok/s)", ylabel="TTFT (ms)", yscale="log")
    axes[1].set(xlabel="output throughput (tok/s)", ylabel="TPOT (ms)", yscale="log")
    axes[0].text(0.01, 0.99, "labels: request rate (req/s)", transform=axes[0].transAxes,
                 fontsize=7, va="top")
    save(fig, axes, path, title)


LATENCY = Spec(
    name="latency_throughput",
    title="Latency-throughput trade-off over the request rate",
    claim=("Serving benchmarks (vLLM `bench serve`, DistServe, Sarathi-Serve): as the offered "
           "load grows, throughput rises until the engine saturates while TTFT first stays "
           "flat and then explodes with queueing; TPOT grows with the batch. The knee is the "
           "operating point: most of the throughput before latency takes off."),
    params=((CONC, "max concurrency"), (RATE, "rate (req/s)")),
    metrics=(Metric("request_throughput", "req/s", ".2f"),
             Metric("output_throughput", "output tok/s"),
             Metric("median_ttft_ms", "p50 TTFT (ms)", ".0f"),
             Metric("p99_ttft_ms", "p99 TTFT (ms)", ".0f"),
             Metric("median_tpot_ms", "p50 TPOT (ms)", ".1f"),
             Metric("p99_tpot_ms", "p99 TPOT (ms)", ".1f"),
             Metric("mean_num_running", "mean running", ".1f")),
    figure=latency_figure, notes=latency_notes,
)
