"""PagedAttention: paged vs contiguous KV allocation at one KV budget."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from schedlab.runs.plots import new_figure

from .common import (
    Metric,
    Spec,
    find,
    kv_reserved_pct,
    kv_token_pct,
    kv_used_of_reserved,
    paired_ratio,
    save,
)

KV = "exp.kv"


def paged_notes(rows: list, runs: Sequence) -> list[str]:
    out = []
    paged = find(rows, {KV: "paged"})
    for r in rows:
        tok, res = r.get("kv_token_pct"), r.get("kv_reserved_pct")
        line = (f"{r.params[KV]}: token state fills {tok:.1f}% of the KV pool "
                f"({r.get('kv_used_of_reserved'):.1f}% of what is reserved, {res:.1f}% of the "
                f"pool reserved), peak {r.get('max_num_running'):.0f} / mean "
                f"{r.get('mean_num_running'):.1f} running requests")
        if paged is not None and r is not paged:
            line += (f"; paged / {r.params[KV]} output throughput "
                     f"{paired_ratio(paged, r, 'output_throughput')}")
        out.append(line)
    return out


def paged_figure(rows: list, path: Path, title: str) -> None:
    fig, axes = new_figure(3, 1, size=(4.2, 3.8))
    names = [str(r.params[KV]) for r in rows]
    xs = list(range(len(rows)))

    def bars(ax: Any, key: str, offset: float, width: float, label: str) -> None:
        med = [r.stats[key].median or 0.0 for r in rows]
        err = [[m - (r.stats[key].lo or 0.0) for m, r in zip(med, rows, strict=True)],
               [(r.stats[key].hi or 0.0) - m for m, r in zip(med, rows, strict=True)]]
        ax.bar([x + offset for x in xs], med, width, yerr=err, capsize=3, label=label)

    bars(axes[0], "max_num_running", -0.2, 0.4, "peak")
    bars(axes[0], "mean_num_running", 0.2, 0.4, "mean")
    axes[0].set(ylabel="running requests")
    tok = [r.get("kv_token_pct") or 0.0 for r in rows]
    res = [r.get("kv_reserved_pct") or 0.0 for r in rows]
    axes[1].bar(xs, tok, 0.6, label="token state")
    axes[1].bar(xs, [max(0.0, b - a) for a, b in zip(tok, res, strict=True)], 0.6, bottom=tok,
                label="reserved, no token")
    axes[1].set(ylabel="% of the KV pool (mean over steps)", ylim=(0, 100))
    bars(axes[2], "output_throughput", 0.0, 0.6, "output tok/s")
    axes[2].set(ylabel="output throughput (tok/s)")
    for ax in axes:
        ax.set_xticks(xs, names, fontsize=8)
    save(fig, axes, path, title)


PAGED = Spec(
    name="paged_vs_contiguous",
    title="Paged vs contiguous KV allocation at one KV budget (PagedAttention)",
    claim=("vLLM / PagedAttention (SOSP'23): systems that reserve a contiguous KV region per "
           "request keep token state in only 20.4-38.2% of their KV memory; paging raises the "
           "batch size and gives 2-4x the throughput at the same latency."),
    params=((KV, "KV allocator"),),
    metrics=(Metric("max_num_running", "peak running", ".0f"),
             Metric("mean_num_running", "mean running", ".1f"),
             Metric("kv_token_pct", "token state / pool (%)", ".1f", kv_token_pct),
             Metric("kv_reserved_pct", "reserved / pool (%)", ".1f", kv_reserved_pct),
             Metric("kv_used_of_reserved", "token state / reserved (%)", ".1f",
                    kv_used_of_reserved),
             Metric("num_preemptions", "preemptions", ".0f"),
             Metric("output_throughput", "output tok/s"),
             Metric("mean_e2el_ms", "mean E2EL (ms)", ".0f")),
    figure=paged_figure, notes=paged_notes,
    hidden=("kv_allocator",),
    order={KV: ["contiguous", "contiguous_request", "paged"]},
)
