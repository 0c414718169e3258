"""Run metrics with vLLM's definitions and key names (`vllm bench serve`), plus engine metrics.

Per request (completed ones only; rejected and aborted requests are counted, never timed):

- TTFT = first token time - arrival time (queueing included);
- TPOT = (E2EL - TTFT) / (output tokens - 1), only for requests with more than one token;
- ITL = each gap between consecutive output tokens, pooled over all requests;
- E2EL = finish time - arrival time;
- queueing = first scheduled time - arrival time.

Each latency family gets `mean_/median_/std_/pNN_<name>_ms` keys; throughputs divide by the
run's duration. `completed`, `num_rejected` (refused with a reason) and `num_failed` (aborted
or errored) are disjoint and add up to the requests submitted; `max_concurrent_requests` is the
peak of requests in flight (arrival to end) whatever the path. Engine metrics come from the
per-step series (KV use over the whole cluster's pool, batch size, waste; `max_num_running` is
the peak of running seats).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from schedlab.runs.groups import group_metrics, per_second, percentile_keys
from schedlab.runs.request_stats import REJECTED, RequestStats
from schedlab.runs.run_result import RunResult
from schedlab.runs.token_reads import itls, peak_output_rate, pooled_itls
from schedlab.stats import StepTotals

if TYPE_CHECKING:
    from schedlab.runs.driver import RunResult

SLO_KEYS = ("ttft", "tpot", "e2el")
_SLO_ITEM = re.compile(r"\s*([a-z0-9_]+)\s*[=:]\s*([0-9.eE+-]+)\s*(?:ms)?\s*")


def parse_slo(s: str) -> dict[str, float]:
    """Parse an SLO string such as "ttft=200,tpot=50" (or vLLM's "ttft:200 tpot:50"), in ms.

    Raises:
        ValueError: an unknown key, a value that is not a positive number, or a bad item.
    """
    out: dict[str, float] = {}
    for item in re.split(r"[,\s]+", s.strip()):
        if not item:
            continue
        m = _SLO_ITEM.fullmatch(item)
        if m is None:
            raise ValueError(f"SLO item {item!r} is not 'key=milliseconds' (e.g. 'ttft=200')")
        key = m.group(1)
        if key not in SLO_KEYS:
            raise ValueError(f"SLO key {key!r} is unknown; accepted: {', '.join(SLO_KEYS)}")
        try:
            value = float(m.group(2))
        except ValueError:
            value = math.nan
        if not value > 0:
            raise ValueError(f"SLO {key}={m.group(2)!r} must be a positive number of ms")
        if key in out:
            raise ValueError(f"SLO {key} is given twice in {s!r}; give each objective once")
        out[key] = value
    if not out:
        raise ValueError(f"SLO {s!r} is empty; e.g. 'ttft=200,tpot=50' (milliseconds)")
    return out


def compute_metrics(
    run: RunResult,
    percentiles: Sequence[float] = (50, 90, 95, 99),
    slo: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Summarise a run with vLLM's benchmark keys plus engine-side metrics.

    Args:
        run: the run to summarise.
        percentiles: which `pNN_*_ms` keys to report.
        slo: per-request limits in ms (`ttft`, `tpot`, `e2el`) for `request_goodput`:
            completed requests meeting all of them and their own deadline (`deadline_ms`,
            when they have one), per second; None, and no request with a deadline, leaves
            goodput None.

    Returns:
        A JSON-ready dict: scalars (`completed`, `num_rejected`, `duration`, throughputs,
        latency statistics, engine metrics) and per-request lists over completed requests
        (`input_lens`, `output_lens`, `ttfts`, `tpots` (None for one-token outputs), `e2els`,
        `itls` (one list per request)); latencies in the lists are in seconds, as vLLM's.
    """
    if slo is not None:
        unknown = sorted(set(slo) - set(SLO_KEYS))
        if unknown:
            raise ValueError(f"SLO keys {unknown} are unknown; accepted: {', '.join(SLO_KEYS)}")
    stats = run.stats if run.stats is not None else RequestStats.of(run.requests,
                                                                     run.start_time)
    done = stats.completed
    dur = run.duration_s
    ttfts, e2els, queue = stats.ttft[done], stats.e2el[done], stats.queue[done]
    tpots = stats.tpots(done)
    total_in = int(stats.num_input[done].sum())
    total_out = int(stats.num_output[done].sum())
    num_done, num_rejected = len(done), stats.count(REJECTED)

    m: dict[str, Any] = {
        "duration": dur,
        "completed": num_done,
        "num_rejected": num_rejected,
        "num_failed": stats.num_ended() - num_done - num_rejected,
        "max_concurrency": run.max_concurrency,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": per_second(num_done, dur),
        "request_goodput": None,
        "output_throughput": per_second(total_out, dur),
        "total_token_throughput": per_second(total_in + total_out, dur),
    }
    if stats.has_objectives(slo):
        m["request_goodput"] = per_second(int(stats.good(done, slo).sum()), dur)
    if slo:
        m["goodput_slo_ms"] = dict(slo)
    m["max_output_tokens_per_s"] = peak_output_rate(stats)
    m["max_concurrent_requests"] = stats.peak_in_flight()
    for name, values in (("ttft", ttfts), ("tpot", tpots[~np.isnan(tpots)]), ("itl", None),
                         ("e2el", e2els), ("queue", queue)):
        # NOTE: the gaps, a run's largest series, are read for their keys only and scaled in
        # place: no copy of them is held past their keys
        m.update(_stats(name, _in_ms(pooled_itls(stats, done)) if values is None
                        else values * 1000.0, percentiles))
    m.update(engine_metrics(run))
    # per_client / per_slo_class / jain_fairness_index / service_timeline, when present
    m.update(group_metrics(stats, dur, run.start_time, percentiles, slo))
    if run.stats is None:  # NOTE: a streaming run (`driver.save_detailed=false`) has none
        m.update(input_lens=stats.num_input[done].tolist(),
                 output_lens=stats.num_output[done].tolist(), ttfts=ttfts.tolist(),
                 tpots=[None if t != t else t for t in tpots.tolist()], e2els=e2els.tolist(),
                 itls=itls(stats, done), errors=list(stats.errors.values()))
    return m


def engine_metrics(run: RunResult) -> dict[str, Any]:
    """Engine-side metrics from the per-step series (none of them in vLLM's benchmark): a
    streaming run's `step_totals`, or the totals of its `step_stats`."""
    t = run.step_totals
    if t is None:
        # NOTE: a cluster's KV use is every instance's used blocks at each step over the
        # whole cluster's pool (one instance's peak over the cluster's pool would shrink
        # with N)
        t = StepTotals.of(run.step_stats, run.kv_used_blocks, run.num_running)
    n = t.num_steps
    reserved, used = t.total("kv_reserved_tokens"), t.total("kv_used_tokens")
    peak_blocks = t.peak_kv_used_blocks
    return {
        "num_steps": n,
        "num_preemptions": run.num_preemptions,
        "num_swaps": run.num_swaps,
        "prefix_cache_hit_rate": run.prefix_hit_rate,
        "num_kv_blocks": run.num_kv_blocks,
        "peak_kv_used_blocks": peak_blocks,
        "peak_kv_usage_pct": 100.0 * peak_blocks / run.num_kv_blocks if run.num_kv_blocks else 0.0,
        # NOTE: `np.mean` of integers is their exact sum over the count (see `StepTotals`)
        "mean_kv_usage_pct": (100.0 * (t.kv_used_blocks / n) / run.num_kv_blocks
                              if n and run.num_kv_blocks else 0.0),
        "mean_kv_reserved_tokens": reserved / n if n else 0.0,
        "mean_kv_used_tokens": used / n if n else 0.0,
        "kv_waste_pct": 100.0 * (1.0 - used / reserved) if reserved else 0.0,
        "mean_batch_size": t.mean("num_scheduled_seqs"),
        "mean_num_running": t.num_running / n if n else 0.0,
        "max_num_running": t.max_num_running,
        "mean_num_waiting": t.mean("num_waiting"),
        "mean_tokens_per_step": t.mean("num_scheduled_tokens"),
        "mean_step_time_ms": 1000.0 * _mean(np.frombuffer(t.step_time)),
        "mean_framework_time_ms": 1000.0 * _mean(np.frombuffer(t.framework_time)),
        **t.phase_metrics(),
    }


def _stats(name: str, values_ms: np.ndarray, percentiles: Sequence[float]
           ) -> dict[str, float]:
    # NOTE: like vLLM, an empty series reports 0 rather than NaN.
    a = values_ms if len(values_ms) else np.zeros(1)
    out = {f"mean_{name}_ms": float(a.mean()), f"median_{name}_ms": float(np.median(a)),
           f"std_{name}_ms": float(a.std())}
    out.update(percentile_keys(name, a, percentiles))
    return out


def _in_ms(seconds: np.ndarray) -> np.ndarray:
    seconds *= 1000.0
    return seconds


def _mean(values: Sequence[float] | np.ndarray) -> float:
    return float(np.mean(values)) if len(values) else 0.0
