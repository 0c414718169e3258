"""What each paper experiment reports: its columns, derived metrics, summary notes and figure.

`summarize.py` groups the runs of a sweep into rows (one per point, its seeds aggregated) and
hands them here. A row has `params` (config key -> value), `runs` (the RunRecords of its seeds)
and `stats` (metric key -> Stat with median, lo, hi, n). No Hydra, no engine: plain data.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedlab.plots import new_figure

Getter = Callable[[Any], float | None]


@dataclass(frozen=True, slots=True)
class Metric:
    """A table column: a results.json key, or a value derived from one run."""

    key: str
    label: str
    fmt: str = ".1f"
    derive: Getter | None = None

    def value(self, run: Any) -> float | None:
        v = self.derive(run) if self.derive is not None else run.metrics.get(self.key)
        return None if v is None or isinstance(v, bool) else float(v)


@dataclass(frozen=True, slots=True)
class Spec:
    """One experiment: the paper's claim and how its sweep is tabulated and drawn."""

    name: str
    title: str
    claim: str
    params: tuple[tuple[str, str], ...]  # (config key, column label), in table order
    metrics: tuple[Metric, ...]
    figure: Callable[[list, Path, str], None]
    notes: Callable[[list, Sequence], list[str]]
    hidden: tuple[str, ...] = ()  # swept keys implied by the params (not shown)
    order: dict[str, list[Any]] = field(default_factory=dict)  # categorical orders


# ---- derived per-run values --------------------------------------------------------------
def output_len_cv(run: Any) -> float | None:
    lens = run.metrics.get("output_lens") or []
    if len(lens) < 2 or statistics.fmean(lens) == 0:
        return None
    return statistics.pstdev(lens) / statistics.fmean(lens)


def normalized_latency_ms(run: Any) -> float | None:
    """Orca's normalized latency: mean over requests of E2E latency / output tokens (ms)."""
    pairs = [(e, n) for e, n in zip(run.metrics.get("e2els") or [],
                                    run.metrics.get("output_lens") or [], strict=False) if n]
    return 1000.0 * statistics.fmean(e / n for e, n in pairs) if pairs else None


def _pool_tokens(run: Any) -> float | None:
    blocks, bs = run.metrics.get("num_kv_blocks"), run.config.get("engine.block_size")
    return float(blocks * bs) if blocks and bs else None


def kv_token_pct(run: Any) -> float | None:
    """Share of the KV pool holding token state, averaged over steps."""
    pool = _pool_tokens(run)
    used = run.metrics.get("mean_kv_used_tokens")
    return 100.0 * used / pool if pool and used is not None else None


def kv_reserved_pct(run: Any) -> float | None:
    """Share of the KV pool reserved by running requests, averaged over steps."""
    pool = _pool_tokens(run)
    res = run.metrics.get("mean_kv_reserved_tokens")
    return 100.0 * res / pool if pool and res is not None else None


def kv_used_of_reserved(run: Any) -> float | None:
    waste = run.metrics.get("kv_waste_pct")
    return None if waste is None else 100.0 - waste


# ---- helpers over rows -------------------------------------------------------------------
def _rows_where(rows: list, key: str, value: Any) -> list:
    return [r for r in rows if r.params.get(key) == value]


def _values(rows: list, key: str) -> list:
    seen: list = []
    for r in rows:
        if r.params.get(key) not in seen:
            seen.append(r.params.get(key))
    return seen


def paired_ratio(a: Any, b: Any, metric: str, derive: Getter | None = None) -> str:
    """a / b of a metric, paired seed by seed: 'median [min-max]x' ('-' if no pair)."""
    get = derive or (lambda run: run.metrics.get(metric))
    b_by_seed = {run.config.get("seed"): get(run) for run in b.runs}
    ratios = []
    for run in a.runs:
        va, vb = get(run), b_by_seed.get(run.config.get("seed"))
        if va is not None and vb:
            ratios.append(va / vb)
    if not ratios:
        return "-"
    med = statistics.median(ratios)
    if len(ratios) > 1 and f"{min(ratios):.2f}" != f"{max(ratios):.2f}":
        return f"{med:.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"
    return f"{med:.2f}x"


def _find(rows: list, params: dict[str, Any]) -> Any | None:
    """The row with these parameter values (None if the sweep has none)."""
    for r in rows:
        if all(r.params.get(k) == v for k, v in params.items()):
            return r
    return None


def _config_value(runs: Sequence, key: str, default: Any = None) -> Any:
    v = runs[0].config.get(key, default) if runs else default
    if isinstance(v, str) and v.startswith("["):
        return json.loads(v)
    return default if v is None else v


def _line(ax: Any, rows: list, x: str, y: str, label: str, style: str = "o-",
          x_metric: bool = False) -> None:
    """Medians joined by a line, min-max as error bars; x is a param or (x_metric) a metric."""
    pts = []
    for r in rows:
        xv = r.stats[x].median if x_metric else r.params.get(x)
        s = r.stats[y]
        if xv is None or s.median is None:
            continue
        pts.append((float(xv), s.median, s.median - s.lo, s.hi - s.median))
    if not pts:
        return
    pts.sort()
    ax.errorbar([p[0] for p in pts], [p[1] for p in pts],
                yerr=[[p[2] for p in pts], [p[3] for p in pts]], fmt=style, capsize=3,
                label=label, markersize=4)


def _save(fig: Any, axes: list, path: Path, title: str) -> None:
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.savefig(path, dpi=100)


# ---- 1. orca -------------------------------------------------------------------------------
SCHED = "scheduler.name"
SIGMA = "workload.output_len.sigma"


def orca_notes(rows: list, runs: Sequence) -> list[str]:
    out = []
    for sigma in _values(rows, SIGMA):
        cont = _find(rows, {SCHED: "continuous", SIGMA: sigma})
        stat = _find(rows, {SCHED: "static", SIGMA: sigma})
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
    for sched in _values(rows, SCHED):
        sub = _rows_where(rows, SCHED, sched)
        _line(axes[0], sub, "output_len_cv", "output_throughput", sched, x_metric=True)
        _line(axes[1], sub, "output_len_cv", "norm_latency_ms", sched, x_metric=True)
    axes[0].set(xlabel="output-length CV (std / mean)", ylabel="output throughput (tok/s)")
    axes[1].set(xlabel="output-length CV (std / mean)", ylabel="normalized latency (ms / token)")
    axes[1].set_yscale("log")
    _save(fig, axes, path, title)


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


# ---- 2. paged vs contiguous ----------------------------------------------------------------
KV = "exp.kv"


def paged_notes(rows: list, runs: Sequence) -> list[str]:
    out = []
    paged = _find(rows, {KV: "paged"})
    for r in rows:
        tok, res = r.get("kv_token_pct"), r.get("kv_reserved_pct")
        line = (f"{r.params[KV]}: token state fills {tok:.1f}% of the KV pool "
                f"({r.get('kv_used_of_reserved'):.1f}% of what is reserved, {res:.1f}% of the "
                f"pool reserved), peak {r.get('max_concurrent_requests'):.0f} / mean "
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

    bars(axes[0], "max_concurrent_requests", -0.2, 0.4, "peak")
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
    _save(fig, axes, path, title)


PAGED = Spec(
    name="paged_vs_contiguous",
    title="Paged vs contiguous KV allocation at one KV budget (PagedAttention)",
    claim=("vLLM / PagedAttention (SOSP'23): systems that reserve a contiguous KV region per "
           "request keep token state in only 20.4-38.2% of their KV memory; paging raises the "
           "batch size and gives 2-4x the throughput at the same latency."),
    params=((KV, "KV allocator"),),
    metrics=(Metric("max_concurrent_requests", "peak running", ".0f"),
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


# ---- 3. chunked prefill ----------------------------------------------------------------------
VARIANT = "exp.sched"
RATE = "workload.arrival.rate"


def capacity(rows: list, slo_ms: float, ttft_ms: float) -> tuple[float | None, bool]:
    """The largest rate meeting p99 ITL <= slo_ms and median TTFT <= ttft_ms (medians over
    seeds), interpolated linearly between the last swept rate that meets both (with every lower
    rate) and the first that does not.

    Returns:
        (rate, censored): rate None when even the lowest rate fails; censored True when the
        highest swept rate still meets both (the capacity is at least that).
    """
    pts = sorted(rows, key=lambda r: r.params[RATE])
    limits = (("p99_itl_ms", slo_ms), ("median_ttft_ms", ttft_ms))
    prev = None
    for r in pts:
        fails = [(k, lim) for k, lim in limits if r.get(k) is None or r.get(k) > lim]
        if not fails:
            prev = r
            continue
        if prev is None:
            return None, False
        x0, x1 = prev.params[RATE], r.params[RATE]
        cross = x1
        for k, lim in fails:
            y0, y1 = prev.get(k), r.get(k)
            if y1 is not None and y1 > y0:
                cross = min(cross, x0 + (x1 - x0) * (lim - y0) / (y1 - y0))
        return cross, False
    return (prev.params[RATE], True) if prev is not None else (None, False)


def chunked_notes(rows: list, runs: Sequence) -> list[str]:
    slos = _config_value(runs, "exp.slo_tbt_ms", [])
    ttft = float(_config_value(runs, "exp.slo_median_ttft_ms", math.inf))
    focus = _config_value(runs, "exp.focus_rate")
    variants = _values(rows, VARIANT)
    out = []
    lowest = min(_values(rows, RATE))
    for slo in slos:
        caps = {v: capacity(_rows_where(rows, VARIANT, v), slo, ttft) for v in variants}
        text = ", ".join(
            f"{v} " + (f"< {lowest:g}" if c is None else f"{'>= ' if cens else ''}{c:.1f}")
            + " req/s" for v, (c, cens) in caps.items())
        line = f"capacity at p99 TBT (ITL) <= {slo:g} ms and median TTFT <= {ttft:g} ms: {text}"
        if len(variants) == 2 and all(c for c, _ in caps.values()):
            (a, ca), (b, cb) = (caps[v] for v in variants)
            line += f" ({b / a:.2f}x{', a bound: a capacity is censored' if ca or cb else ''})"
        out.append(line)
    if focus is not None:
        for v in variants:
            r = _find(rows, {VARIANT: v, RATE: focus})
            if r is not None:
                out.append(f"at {focus} req/s, {v}: p99 ITL {r.get('p99_itl_ms'):.1f} ms, "
                           f"p99 TPOT {r.get('p99_tpot_ms'):.1f} ms, median TTFT "
                           f"{r.get('median_ttft_ms'):.0f} ms, p99 TTFT "
                           f"{r.get('p99_ttft_ms'):.0f} ms")
    return out


def chunked_figure(rows: list, path: Path, title: str) -> None:
    fig, axes = new_figure(3, 1, size=(4.2, 3.8))
    runs = [run for r in rows for run in r.runs]
    for v in _values(rows, VARIANT):
        sub = _rows_where(rows, VARIANT, v)
        _line(axes[0], sub, RATE, "p99_itl_ms", str(v))
        _line(axes[1], sub, RATE, "p99_tpot_ms", str(v))
        _line(axes[2], sub, RATE, "median_ttft_ms", f"{v} median")
        _line(axes[2], sub, RATE, "p99_ttft_ms", f"{v} p99", style="x--")
    for slo in _config_value(runs, "exp.slo_tbt_ms", []):
        axes[0].axhline(slo, color="gray", ls=":", lw=1)
        axes[0].annotate(f"SLO {slo:g} ms", (axes[0].get_xlim()[0], slo), fontsize=7)
    ttft = _config_value(runs, "exp.slo_median_ttft_ms")
    if ttft is not None:
        axes[2].axhline(ttft, color="gray", ls=":", lw=1)
    axes[0].set(xlabel="request rate (req/s)", ylabel="p99 ITL = TBT (ms)", yscale="log")
    axes[1].set(xlabel="request rate (req/s)", ylabel="p99 TPOT (ms)", yscale="log")
    axes[2].set(xlabel="request rate (req/s)", ylabel="TTFT (ms)", yscale="log")
    _save(fig, axes, path, title)


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


# ---- 4. prefix caching ---------------------------------------------------------------------
CACHE = "prefix_cache.name"
SHARED = "exp.split.pct"


def prefix_notes(rows: list, runs: Sequence) -> list[str]:
    out = []
    for pct in _values(rows, SHARED):
        base = _find(rows, {CACHE: "none", SHARED: pct})
        parts = []
        for cache in ("hash_block", "radix"):
            r = _find(rows, {CACHE: cache, SHARED: pct})
            if r is None or base is None:
                continue
            parts.append(f"{cache}: hit rate {r.get('prefix_cache_hit_rate'):.2f}, mean TTFT "
                         f"none / {cache} {paired_ratio(base, r, 'mean_ttft_ms')}, throughput "
                         f"{cache} / none {paired_ratio(r, base, 'output_throughput')}")
        if parts:
            out.append(f"{pct}% shared: " + "; ".join(parts))
    return out


def prefix_figure(rows: list, path: Path, title: str) -> None:
    fig, axes = new_figure(3, 1, size=(4.2, 3.8))
    for cache in _values(rows, CACHE):
        sub = _rows_where(rows, CACHE, cache)
        _line(axes[0], sub, SHARED, "mean_ttft_ms", str(cache))
        _line(axes[1], sub, SHARED, "output_throughput", str(cache))
        _line(axes[2], sub, SHARED, "prefix_cache_hit_rate", str(cache))
    axes[0].set(xlabel="shared prefix (% of the prompt)", ylabel="mean TTFT (ms)")
    axes[1].set(xlabel="shared prefix (% of the prompt)", ylabel="output throughput (tok/s)")
    axes[2].set(xlabel="shared prefix (% of the prompt)", ylabel="prefix hit rate (tokens)")
    _save(fig, axes, path, title)


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
             Metric("p99_ttft_ms", "p99 TTFT (ms)", ".1f"),
             Metric("output_throughput", "output tok/s"),
             Metric("request_throughput", "req/s", ".2f")),
    figure=prefix_figure, notes=prefix_notes,
    hidden=("exp.split", "workload.prefix_len", "workload.input_len"),
    order={CACHE: ["none", "hash_block", "radix"]},
)


# ---- 5. latency-throughput -------------------------------------------------------------------
CONC = "driver.max_concurrency"


def knee(rows: list) -> Any | None:
    """Kneedle on (output throughput, p99 TTFT): the point furthest above the chord from the
    lowest- to the highest-rate point, both axes scaled to [0, 1]; None without a knee."""
    pts = sorted((r for r in rows if r.get("output_throughput") is not None
                  and r.get("p99_ttft_ms") is not None), key=lambda r: r.params[RATE])
    if len(pts) < 3:
        return None
    xs = [r.get("output_throughput") for r in pts]
    ys = [r.get("p99_ttft_ms") for r in pts]
    (x0, x1), (y0, y1) = (min(xs), max(xs)), (min(ys), max(ys))
    if x1 <= x0 or y1 < 2 * y0:  # latency never took off: no knee within the sweep
        return None
    scores = [(x - x0) / (x1 - x0) - (y - y0) / (y1 - y0) for x, y in zip(xs, ys, strict=True)]
    return pts[max(range(len(pts)), key=scores.__getitem__)]


def latency_notes(rows: list, runs: Sequence) -> list[str]:
    out = []
    for conc in _values(rows, CONC):
        sub = _rows_where(rows, CONC, conc)
        k = knee(sub)
        top = max(sub, key=lambda r: r.get("output_throughput") or 0.0)
        name = f"max concurrency {'none' if conc is None else conc}"
        if k is None:
            out.append(f"{name}: no knee within the swept rates (p99 TTFT stays within 2x)")
            continue
        out.append(f"{name}: knee at {k.params[RATE]} req/s: {k.get('output_throughput'):.1f} "
                   f"output tok/s ({100 * k.get('output_throughput') / top.get('output_throughput'):.0f}% "
                   f"of the most measured), p50 / p99 TTFT {k.get('median_ttft_ms'):.0f} / "
                   f"{k.get('p99_ttft_ms'):.0f} ms, p50 / p99 TPOT {k.get('median_tpot_ms'):.1f}"
                   f" / {k.get('p99_tpot_ms'):.1f} ms; at {top.params[RATE]} req/s: "
                   f"{top.get('output_throughput'):.1f} tok/s, p99 TTFT "
                   f"{top.get('p99_ttft_ms'):.0f} ms")
    return out


def latency_figure(rows: list, path: Path, title: str) -> None:
    fig, axes = new_figure(2, 1, size=(5.0, 3.8))
    for conc in _values(rows, CONC):
        sub = _rows_where(rows, CONC, conc)
        tag = "no cap" if conc is None else f"cap {conc}"
        for ax, (p50, p99) in zip(axes, (("median_ttft_ms", "p99_ttft_ms"),
                                        ("median_tpot_ms", "p99_tpot_ms")), strict=True):
            _line(ax, sub, "output_throughput", p50, f"p50, {tag}", x_metric=True)
            _line(ax, sub, "output_throughput", p99, f"p99, {tag}", style="s--", x_metric=True)
        for r in sorted(sub, key=lambda r: r.params[RATE]):
            axes[0].annotate(f"{r.params[RATE]:g}", (r.get("output_throughput"),
                                                     r.get("p99_ttft_ms")),
                             fontsize=6, xytext=(2, 2), textcoords="offset points")
        k = knee(sub)
        if k is not None:
            for ax, key in ((axes[0], "p99_ttft_ms"), (axes[1], "p99_tpot_ms")):
                ax.plot([k.get("output_throughput")], [k.get(key)], "*", markersize=14,
                        color="red", label=f"knee ({tag}): {k.params[RATE]:g} req/s")
    axes[0].set(xlabel="output throughput (tok/s)", ylabel="TTFT (ms)", yscale="log")
    axes[1].set(xlabel="output throughput (tok/s)", ylabel="TPOT (ms)", yscale="log")
    axes[0].text(0.01, 0.99, "labels: request rate (req/s)", transform=axes[0].transAxes,
                 fontsize=7, va="top")
    _save(fig, axes, path, title)


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

SPECS: dict[str, Spec] = {s.name: s for s in (ORCA, PAGED, CHUNKED, PREFIX, LATENCY)}
