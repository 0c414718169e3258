"""Per-client and per-SLO-class metrics, fairness between clients, and the service each
client received over time (VTC's figures).

Service counts tokens the way the VTC paper does: `input_weight` per prompt token of a request
that got its first token (its prompt was served), plus `output_weight` per output token,
credited when the token was produced. A request's deadline (`Request.deadline_ms`) is an
objective for its first token: it is met when TTFT <= deadline.

Fairness is measured while clients compete. A client is *backlogged* while at least one of its
requests is in the system (the union of its requests' [arrival, end] intervals).

- `jain_fairness_index`: Jain's index (sum x)^2 / (n sum x^2) over x_c = the service client c
  received / the time it was backlogged: 1 when every client is served at the same rate while
  it waits, 1/n when one is served and the others starve. (Total service cannot tell policies
  apart once every request completes: it equals the demand.)
- `max_service_difference`: the largest |W_f(t1, t2) - W_g(t1, t2)| over every pair of clients
  f, g and every interval [t1, t2] in which both were backlogged the whole time, W being the
  weighted tokens served in the interval. NOTE: backlogged here means a request in the
  system (queued or running), wider than VTC's (Sheng et al. OSDI '24) "requests waiting in
  the queue", so this is an envelope of the quantity VTC bounds, not the bounded quantity: it
  moves with the policy, but is not expected to stay under VTC's bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from schedlab.runs.token_reads import token_chunks, token_times

if TYPE_CHECKING:
    from schedlab.runs.request_stats import RequestStats

#: the default service weights (VTC's w_p and w_q)
SERVICE_WEIGHTS = (1.0, 2.0)
#: bins of the service timeline
NUM_TIMELINE_BINS = 40
#: the group of requests without a client id or SLO class
NONE = "<none>"
#: events per window of the service-difference scan (bounds its temporaries)
SPREAD_WINDOW = 1 << 20

Intervals = list[tuple[float, float]]


class Events(NamedTuple):
    """A client's service: `weight` at each of `times` (sorted), plus `credit[i]` at
    `times[first[i]]` (a request's prompt, at its first token); `first` is sorted."""

    times: np.ndarray
    first: np.ndarray
    credit: np.ndarray
    weight: float

    def amounts(self, lo: int, hi: int) -> np.ndarray:
        """The weighted tokens served at `times[lo:hi]`."""
        v = np.full(hi - lo, self.weight, dtype=float)
        i, j = np.searchsorted(self.first, (lo, hi))
        v[self.first[i:j] - lo] += self.credit[i:j]
        return v


def jain_index(values: Iterable[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1 when all equal, 1/n when one takes
    everything. None for no values or all zero."""
    x = np.asarray(list(values), dtype=float)
    sq = float((x * x).sum())
    return float(x.sum() ** 2 / (len(x) * sq)) if len(x) and sq > 0 else None


def backlog(stats: RequestStats, positions: np.ndarray, end: float) -> Intervals:
    """The union of the [arrival, end] intervals of the requests at `positions`, sorted and
    disjoint (`end` for a request that never ended)."""
    finished = stats.finished[positions]
    ends = np.where(np.isnan(finished), end, finished)
    spans = sorted(zip(stats.arrival[positions].tolist(), ends.tolist(), strict=True))
    out: Intervals = []
    for a, b in spans:
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def service_events(stats: RequestStats, positions: np.ndarray,
                   weights: Sequence[float] = SERVICE_WEIGHTS) -> Events:
    """The service of the requests at `positions`: `weights[1]` at each token's time, plus
    `weights[0]` per prompt token at each request's first token (its prompt served)."""
    served = positions[stats.num_tokens[positions] > 0]
    t = token_times(stats, served)
    order = np.argsort(t, kind="stable")
    counts = stats.num_tokens[served]
    rank = np.empty(len(order), np.intp)
    rank[order] = np.arange(len(order))
    first = rank[np.cumsum(counts) - counts]  # where each request's first token sorts to
    del rank
    by_time = np.argsort(first)
    return Events(t[order], first[by_time],
                  (weights[0] * stats.num_input[served])[by_time], weights[1])


def service_rates(spans: Mapping[str, Intervals], events: Mapping[str, Events]
                  ) -> dict[str, float]:
    """Each client's weighted tokens served per second of its backlog (clients never
    backlogged, e.g. all rejected on arrival, are left out)."""
    out = {}
    for c, intervals in spans.items():
        busy = sum(b - a for a, b in intervals)
        if busy > 0:
            e = events[c]
            out[c] = float(e.amounts(0, len(e.times)).sum()) / busy
    return out


def max_service_difference(spans: Mapping[str, Intervals], events: Mapping[str, Events]
                           ) -> float | None:
    """VTC's maximum service difference between two backlogged clients (see the module
    docstring), in weighted tokens. None with fewer than two clients."""
    clients = sorted(spans)
    if len(clients) < 2:
        return None
    best = 0.0
    for i, f in enumerate(clients):
        for g in clients[i + 1:]:
            for a, b in _intersect(spans[f], spans[g]):
                best = max(best, _spread(events[f], events[g], a, b))
    return best


def _intersect(x: Intervals, y: Intervals) -> Intervals:
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def _spread(ef: Events, eg: Events, a: float, b: float) -> float:
    """max - min over t in [a, b] of W_f(a, t) - W_g(a, t): the largest |difference| over any
    sub-interval."""
    tf, tg = ef.times, eg.times
    f, f_end = np.searchsorted(tf, (a, b), side="right")  # a < t <= b: the times are sorted
    g, g_end = np.searchsorted(tg, (a, b), side="right")
    if f == f_end and g == g_end:
        return 0.0
    total = top = bottom = 0.0
    while f < f_end or g < g_end:
        # NOTE: window by window of time, each holding every event of its last instant, so a
        # window's temporaries stay small; the running sum goes on across windows
        cut = min([b, *([tf[f + SPREAD_WINDOW]] if f_end - f > SPREAD_WINDOW else []),
                   *([tg[g + SPREAD_WINDOW]] if g_end - g > SPREAD_WINDOW else [])])
        f_next = min(f_end, int(np.searchsorted(tf, cut, side="right")))
        g_next = min(g_end, int(np.searchsorted(tg, cut, side="right")))
        t = np.concatenate([tf[f:f_next], tg[g:g_next]])
        v = np.concatenate([ef.amounts(f, f_next), -1.0 * eg.amounts(g, g_next)])
        # NOTE: service at one instant (one step) counts at once: no spike between two
        # clients' tokens of the same step
        times, first = np.unique(t, return_inverse=True)
        per_time = np.zeros(len(times) + 1)
        per_time[0] = total
        np.add.at(per_time[1:], first, v)
        d = np.cumsum(per_time)
        total, top, bottom = float(d[-1]), max(top, float(d.max())), min(bottom, float(d.min()))
        f, g = f_next, g_next
    return top - bottom


def group_metrics(stats: RequestStats, duration: float, start_time: float,
                  percentiles: Sequence[float] = (50, 90, 99),
                  slo: Mapping[str, float] | None = None,
                  weights: Sequence[float] = SERVICE_WEIGHTS) -> dict[str, Any]:
    """Per-client and per-SLO-class summaries of the filed requests, present only when the
    workload has them.

    Returns:
        `per_client` / `per_slo_class`: name -> {num_requests, completed, num_rejected,
        input/output tokens, `service`, `request_throughput`, `request_goodput` (completed
        requests meeting `slo` and their deadline, per s, as the run's; None where the run has
        neither), `deadline_attainment` (share of all
        its requests that met their deadline; None without deadlines), TTFT/TPOT mean and
        percentiles (ms)};
        `service_timeline` {t_s, clients: name -> service per second in each bin};
        `jain_fairness_index` over the clients' service rates while backlogged and
        `max_service_difference` (see the module docstring);
        `deadline_attainment` over all requests with a deadline.
    """
    out: dict[str, Any] = {}
    filed = stats.filed
    by_client = client_groups(stats)
    if by_client:
        out["per_client"] = {c: _group(stats, pos, duration, percentiles, slo, weights)
                             for c, pos in by_client.items()}
        end = start_time + duration
        spans = {c: backlog(stats, pos, end) for c, pos in by_client.items()}
        events = {c: service_events(stats, pos, weights) for c, pos in by_client.items()}
        out["jain_fairness_index"] = jain_index(service_rates(spans, events).values())
        out["max_service_difference"] = max_service_difference(spans, events)
        out["service_timeline"] = service_timeline(stats, by_client, duration, start_time,
                                                   weights)
    by_class = _split(filed, stats.slo_class[filed], stats.slo_class_names())
    if by_class:
        out["per_slo_class"] = {c: _group(stats, pos, duration, percentiles, slo, weights)
                                for c, pos in by_class.items()}
    with_deadline = filed[~np.isnan(stats.deadline_ms[filed])]
    if len(with_deadline):
        out["deadline_attainment"] = _num_met_deadline(stats, with_deadline) / len(with_deadline)
    return out


def service_timeline(stats: RequestStats, by_client: Mapping[str, np.ndarray],
                     duration: float, start_time: float,
                     weights: Sequence[float] = SERVICE_WEIGHTS,
                     num_bins: int = NUM_TIMELINE_BINS) -> dict[str, Any]:
    """Service per second each client (its requests at `by_client[name]`) received in
    `num_bins` equal bins of the run."""
    width = duration / num_bins if duration > 0 else 1.0
    series = {}
    for c, positions in by_client.items():
        served = positions[stats.num_tokens[positions] > 0]
        acc = np.zeros(num_bins)
        done = 0
        for t, counts in token_chunks(stats, served):
            num_input = stats.num_input[served[done:done + len(counts)]]
            done += len(counts)
            b = np.clip(((t - start_time) / width).astype(int), 0, num_bins - 1)
            # NOTE: credited request by request, its tokens then its prompt at its first
            # token's bin: one order of the float sums, whichever path filed the requests
            ends = np.cumsum(counts)
            tokens = np.arange(len(t)) + np.repeat(np.arange(len(counts)), counts)
            prompts = ends + np.arange(len(counts))
            bins = np.empty(len(t) + len(counts), np.intp)
            amounts = np.empty(len(bins))
            bins[tokens], amounts[tokens] = b, weights[1]
            bins[prompts], amounts[prompts] = b[ends - counts], weights[0] * num_input
            np.add.at(acc, bins, amounts)
        series[c] = (acc / width).tolist()
    return {"t_s": [(i + 1) * width for i in range(num_bins)], "clients": series}


def client_groups(stats: RequestStats) -> dict[str, np.ndarray]:
    """The filed requests' positions by client (`NONE`: none), names sorted; empty when no
    request has a client."""
    filed = stats.filed
    return _split(filed, stats.client[filed], stats.client_names())


def _split(positions: np.ndarray, codes: np.ndarray, names: Sequence[str]
           ) -> dict[str, np.ndarray]:
    """The `positions` by group name (`NONE` for code < 0), each in order, names sorted;
    empty when no position has a group."""
    if not (codes >= 0).any():
        return {}
    order = np.argsort(codes, kind="stable")
    uniq, first = np.unique(codes[order], return_index=True)
    groups: dict[str, np.ndarray] = {}
    for code, chunk in zip(uniq.tolist(), np.split(positions[order], first[1:]), strict=True):
        name = NONE if code < 0 else names[code]
        groups[name] = chunk if name not in groups else np.sort(
            np.concatenate([groups[name], chunk]))
    return dict(sorted(groups.items()))


def per_second(n: float, duration: float) -> float:
    return n / duration if duration > 0 else 0.0


def percentile_keys(name: str, values_ms: np.ndarray, percentiles: Sequence[float]
                    ) -> dict[str, float]:
    """`p50_<name>_ms`-style keys (vLLM's) of a series already in ms."""
    # NOTE: one partition for every percentile: each value equals its own call's
    values = np.percentile(values_ms, list(percentiles)).tolist() if len(percentiles) else []
    out = {}
    for p, v in zip(percentiles, values, strict=True):
        word = str(int(p)) if float(p).is_integer() else str(p)
        out[f"p{word}_{name}_ms"] = float(v)
    return out


def _num_met_deadline(stats: RequestStats, positions: np.ndarray) -> int:
    """Requests at `positions` that completed with their first token by their deadline."""
    return int(stats.met_deadline(stats.completed_among(positions)).sum())


def _group(stats: RequestStats, positions: np.ndarray, duration: float,
           percentiles: Sequence[float], slo: Mapping[str, float] | None,
           weights: Sequence[float]) -> dict[str, Any]:
    done = stats.completed_among(positions)

    def per_s(n: float) -> float:
        return per_second(n, duration)

    deadlines = positions[~np.isnan(stats.deadline_ms[positions])]
    # NOTE: summed in workload order with Python's sum, one request's service after another
    service = (weights[0] * stats.num_input[positions]
               + weights[1] * stats.num_output[positions]).tolist()
    g: dict[str, Any] = {
        "num_requests": len(positions),
        "completed": len(done),
        "num_rejected": stats.num_rejected_among(positions),
        "total_input_tokens": int(stats.num_input[done].sum()),
        "total_output_tokens": int(stats.num_output[done].sum()),
        "service": sum(service),
        "request_throughput": per_s(len(done)),
        "request_goodput": (per_s(int(stats.good(done, slo).sum()))
                            if stats.has_objectives(slo) else None),
        "deadline_attainment": (_num_met_deadline(stats, deadlines) / len(deadlines)
                                if len(deadlines) else None),
    }
    tpots = stats.tpots(done)[stats.num_output[done] > 1]
    for name, xs in (("ttft", stats.ttft[done]), ("tpot", tpots)):
        a = (xs if len(xs) else np.zeros(1)) * 1000.0
        g[f"mean_{name}_ms"] = float(a.mean())
        g.update(percentile_keys(name, a, percentiles))
    return g
