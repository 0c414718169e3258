"""Orca: static vs continuous batching as output lengths spread."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from schedlab.runs.plots import new_figure

from .common import (
    Metric,
    Spec,
    find,
    line,
    normalized_latency_ms,
    output_len_cv,
    paired_ratio,
    rows_where,
    save,
    values,
)

SCHED = "scheduler.name"
SIGMA = "workload.output_len.sigma"


def orca_notes(rows: list, runs: Sequence) -> list[str]:
    out = []
    for sigma in values(rows, SIGMA):
        cont = find(rows, {SCHED: "continuous", SIGMA: sigma})
        stat = find(rows, {SCHED: "static", SIGMA: sigma})
        if cont is None or stat is None:
            continue
        cv = cont.get("output_len_cv")
        out.append(f"sigma {sigma} (output-length CV {cv:.2f}): continuous / static output "
                   f"throughput {paired_ratio(cont, stat, 'output_throughput')}, normalized "
                   f"latency static / continuous "
                   f"{paired_ratio(stat, cont, '', normalized_latency_ms)}")
    return out


def orca_figure(rows: list, path: Path, title: str) -> None:
    fig, axes = new_figure(2, 1, size=(5.0, 3.8))
    for sched in values(rows, SCHED):
        sub = rows_where(rows, SCHED, sched)
        line(axes[0], sub, "output_len_cv", "output_throughput", sched, x_metric=True)
        line(axes[1], sub, "output_len_cv", "norm_latency_ms", sched, x_metric=True)
    axes[0].set(xlabel="output-length CV (std / mean)", ylabel="output throughput (tok/s)")
    axes[1].set(xlabel="output-length CV (std / mean)", ylabel="normalized latency (ms / token)")
    axes[1].set_yscale("log")
    save(fig, axes, path, title)


ORCA = Spec(
    name="orca",
    title="Static vs continuous batching as output lengths spread (Orca)",
    claim=("Orca (OSDI'22): iteration-level scheduling serves requests of different output "
           "lengths without waiting for the longest member of a batch; up to 36.9x the "
           "throughput of FasterTransformer at the same latency (GPT-3 175B)."),
    params=((SCHED, "scheduler"), (SIGMA, "output sigma")),
    metrics=(Metric("output_len_cv", "output CV", ".2f", output_len_cv),
             Metric("output_throughput", "output tok/s"),
             Metric("request_throughput", "req/s", ".2f"),
             Metric("norm_latency_ms", "norm. latency (ms/tok)", ".1f", normalized_latency_ms),
             Metric("mean_e2el_ms", "mean E2EL (ms)", ".0f"),
             Metric("p99_tpot_ms", "p99 TPOT (ms)", ".2f"),
             Metric("mean_batch_size", "mean batch", ".1f")),
    figure=orca_figure, notes=orca_notes,
    order={SCHED: ["static", "continuous"]},
)
