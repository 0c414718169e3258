"""DistServe / Splitwise: prefill/decode disaggregation vs co-location at equal GPUs, SLO
attainment and goodput over the request rate."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from schedlab.runs.plots import new_figure

from .common import RATE, Metric, Spec, config_value, find, line, rows_where, save, values

LAYOUT = "exp.layout"
#: the SLO pairs a run is scored against (two: the table has a column per pair)
NUM_SLOS = 2


def _slos(run: Any) -> list[tuple[float, float]]:
    v = run.config.get("exp.slos")
    pairs = json.loads(v) if isinstance(v, str) else (v or [])
    return [(float(a), float(b)) for a, b in pairs]


def attainment(k: int):
    """The share of a run's requests (all submitted ones) that met SLO pair k: TTFT <= the
    pair's TTFT and TPOT <= its TPOT (a one-token request has no TPOT and meets it)."""
    def get(run: Any) -> float | None:
        slos = _slos(run)
        if k >= len(slos):
            return None
        ttft_ms, tpot_ms = slos[k]
        ttfts, tpots = run.metrics.get("ttfts") or [], run.metrics.get("tpots") or []
        n = sum(run.metrics.get(k, 0) for k in ("completed", "num_rejected", "num_failed"))
        if not n:
            return None
        ok = sum(1 for t, p in zip(ttfts, tpots, strict=True)
                 if 1000 * t <= ttft_ms and (p is None or 1000 * p <= tpot_ms))
        return ok / n
    return get


def goodput(rows: list, key: str, target: float) -> tuple[float | None, bool]:
    """The highest rate whose median attainment is >= target (with every lower rate),
    interpolated linearly to the first rate below it (DistServe's goodput).

    Returns:
        (rate, censored): None when even the lowest rate misses; censored when the highest
        swept rate still meets the target.
    """
    prev = None
    for r in sorted(rows, key=lambda r: r.params[RATE]):
        a = r.get(key)
        if a is not None and a >= target:
            prev = r
            continue
        if prev is None:
            return None, False
        x0, x1, a0 = prev.params[RATE], r.params[RATE], prev.get(key)
        a1 = 0.0 if a is None else a
        return x0 + (x1 - x0) * (a0 - target) / (a0 - a1), False
    return (prev.params[RATE], True) if prev is not None else (None, False)


def _label(runs: Sequence, k: int) -> str:
    slos = _slos(runs[0]) if runs else []
    if k >= len(slos):
        return f"SLO {k + 1}"
    return f"TTFT <= {slos[k][0]:g} ms & TPOT <= {slos[k][1]:g} ms"


def _ms(row: Any, key: str, fmt: str = ".0f") -> str:
    v = row.get(key)
    return "-" if v is None else f"{v:{fmt}} ms"


def disagg_notes(rows: list, runs: Sequence) -> list[str]:
    target = float(config_value(runs, "exp.attainment", 0.9))
    layouts = values(rows, LAYOUT)
    lowest = min(values(rows, RATE))
    out = []
    for k in range(NUM_SLOS):
        caps = {v: goodput(rows_where(rows, LAYOUT, v), f"slo{k}_attainment", target)
                for v in layouts}
        text = ", ".join(
            f"{v} " + (f"< {lowest:g}" if c is None else f"{'>= ' if cens else ''}{c:.1f}")
            + " req/s" for v, (c, cens) in caps.items())
        line_ = f"goodput at {100 * target:g}% attainment of {_label(runs, k)}: {text}"
        pd = caps.get("disaggregated", (None, False))[0]
        ratios = [f"disaggregated / {v} {pd / c:.2f}x" for v, (c, _) in caps.items()
                  if v != "disaggregated" and c and pd]
        if ratios:
            line_ += " (" + ", ".join(ratios) + ")"
        out.append(line_)
    focus = config_value(runs, "exp.focus_rate")
    if focus is not None:
        for v in layouts:
            r = find(rows, {LAYOUT: v, RATE: focus})
            if r is not None:
                out.append(f"at {focus} req/s, {v}: median TTFT {_ms(r, 'median_ttft_ms')}, "
                           f"p90 TTFT {_ms(r, 'p90_ttft_ms')}, median TPOT "
                           f"{_ms(r, 'median_tpot_ms', '.1f')}, p90 TPOT "
                           f"{_ms(r, 'p90_tpot_ms', '.1f')}")
    return out


def disagg_figure(rows: list, path: Path, title: str) -> None:
    fig, axes = new_figure(2, 2, size=(4.2, 3.4))
    runs = [run for r in rows for run in r.runs]
    target = float(config_value(runs, "exp.attainment", 0.9))
    for i, v in enumerate(values(rows, LAYOUT)):
        sub, c = rows_where(rows, LAYOUT, v), f"C{i}"
        for k in range(NUM_SLOS):
            line(axes[k], sub, RATE, f"slo{k}_attainment", str(v), color=c)
        line(axes[2], sub, RATE, "p90_ttft_ms", str(v), color=c)
        line(axes[3], sub, RATE, "p90_tpot_ms", str(v), color=c)
    for k in range(NUM_SLOS):
        axes[k].axhline(target, color="gray", ls=":", lw=1)
        axes[k].set(xlabel="request rate (req/s)", ylabel="SLO attainment",
                    title=_label(runs, k), ylim=(-0.02, 1.02))
        axes[k].title.set_fontsize(8)
    axes[2].set(xlabel="request rate (req/s)", ylabel="p90 TTFT (ms)", yscale="log")
    axes[3].set(xlabel="request rate (req/s)", ylabel="p90 TPOT (ms)", yscale="log")
    save(fig, axes, path, title)


DISAGG = Spec(
    name="disaggregation",
    title="Prefill/decode disaggregation vs co-location at equal GPUs (DistServe)",
    claim=("DistServe (OSDI'24): running prefill and decode on separate GPUs removes their "
           "interference and lets each phase meet its own SLO (TTFT, TPOT); up to 7.4x the "
           "goodput (highest rate at which 90% of requests meet both SLOs) of co-located vLLM. "
           "Splitwise (ISCA'24): 1.4x throughput at 20% lower cost, or 2.35x at equal cost and "
           "power. The KV cache moves from the prefill to the decode GPU over the network."),
    params=((LAYOUT, "layout"), (RATE, "rate (req/s)")),
    metrics=(Metric("slo0_attainment", "attain. SLO 1", ".2f", attainment(0)),
             Metric("slo1_attainment", "attain. SLO 2", ".2f", attainment(1)),
             Metric("request_throughput", "req/s", ".2f"),
             Metric("median_ttft_ms", "p50 TTFT (ms)", ".0f"),
             Metric("p90_ttft_ms", "p90 TTFT (ms)", ".0f"),
             Metric("median_tpot_ms", "p50 TPOT (ms)", ".1f"),
             Metric("p90_tpot_ms", "p90 TPOT (ms)", ".1f")),
    figure=disagg_figure, notes=disagg_notes,
    hidden=("scheduler", "engine.max_num_batched_tokens", "cluster"),
    order={LAYOUT: ["colocated", "colocated_chunked", "disaggregated"]},
)
