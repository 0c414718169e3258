"""Prefix caching: TTFT and throughput vs the shared-prefix fraction, hash vs radix."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from schedlab.runs.plots import new_figure

from .common import (
    Metric,
    Spec,
    find,
    line,
    paired_ratio,
    rows_where,
    save,
    values,
)

CACHE = "prefix_cache.name"
SHARED = "exp.split.pct"


def prefix_notes(rows: list, runs: Sequence) -> list[str]:
    out = []
    for pct in values(rows, SHARED):
        base = find(rows, {CACHE: "none", SHARED: pct})
        parts = []
        for cache in ("hash_block", "radix"):
            r = find(rows, {CACHE: cache, SHARED: pct})
            if r is None or base is None:
                continue
            parts.append(f"{cache}: hit rate {r.get('prefix_cache_hit_rate'):.2f}, mean TTFT "
                         f"none / {cache} {paired_ratio(base, r, 'mean_ttft_ms')}, median TTFT "
                         f"{paired_ratio(base, r, 'median_ttft_ms')}, throughput "
                         f"{cache} / none {paired_ratio(r, base, 'output_throughput')}")
        if parts:
            out.append(f"{pct}% shared: " + "; ".join(parts))
    return out


def prefix_figure(rows: list, path: Path, title: str) -> None:
    fig, axes = new_figure(3, 1, size=(4.2, 3.8))
    for cache in values(rows, CACHE):
        sub = rows_where(rows, CACHE, cache)
        line(axes[0], sub, SHARED, "mean_ttft_ms", str(cache))
        line(axes[1], sub, SHARED, "output_throughput", str(cache))
        line(axes[2], sub, SHARED, "prefix_cache_hit_rate", str(cache))
    axes[0].set(xlabel="shared prefix (% of the prompt)", ylabel="mean TTFT (ms)")
    axes[1].set(xlabel="shared prefix (% of the prompt)", ylabel="output throughput (tok/s)")
    axes[2].set(xlabel="shared prefix (% of the prompt)", ylabel="prefix hit rate (tokens)")
    save(fig, axes, path, title)


PREFIX = Spec(
    name="prefix_caching",
    title="Prefix caching vs the shared-prefix fraction (hash blocks vs radix tree)",
    claim=("Automatic prefix caching (vLLM's hashed blocks; SGLang's RadixAttention, up to "
           "6.4x throughput): a request whose prompt starts with a cached prefix skips that "
           "part of the prefill, so TTFT falls and throughput rises with the shared fraction; "
           "hashed blocks and a radix tree find the same reuse when prefixes are exact."),
    params=((CACHE, "prefix cache"), (SHARED, "shared %")),
    metrics=(Metric("prefix_cache_hit_rate", "hit rate", ".3f"),
             Metric("mean_ttft_ms", "mean TTFT (ms)", ".1f"),
             Metric("median_ttft_ms", "p50 TTFT (ms)", ".1f"),
             Metric("p99_ttft_ms", "p99 TTFT (ms)", ".1f"),
             Metric("output_throughput", "output tok/s"),
             Metric("request_throughput", "req/s", ".2f"),
             Metric("mean_framework_time_ms", "framework ms/step", ".2f")),
    figure=prefix_figure, notes=prefix_notes,
    hidden=("exp.split", "workload.prefix_len", "workload.input_len"),
    order={CACHE: ["none", "hash_block", "radix"]},
)
