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
from typing import Any

import numpy as np

from schedlab.request import Request, RequestStatus

#: the default service weights (VTC's w_p and w_q)
SERVICE_WEIGHTS = (1.0, 2.0)
#: bins of the service timeline
NUM_TIMELINE_BINS = 40
#: the group of requests without a client id or SLO class
NONE = "<none>"

Intervals = list[tuple[float, float]]


def jain_index(values: Iterable[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1 when all equal, 1/n when one takes
    everything. None for no values or all zero."""
    x = np.asarray(list(values), dtype=float)
    sq = float((x * x).sum())
    return float(x.sum() ** 2 / (len(x) * sq)) if len(x) and sq > 0 else None


def backlog(requests: Sequence[Request], end: float) -> Intervals:
    """The union of the requests' [arrival, end] intervals, sorted and disjoint (`end` for a
    request that has not ended)."""
    spans = sorted((r.metrics.arrival_time,
                    end if r.metrics.finished_time is None else r.metrics.finished_time)
                   for r in requests)
    out: Intervals = []
    for a, b in spans:
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def service_events(requests: Sequence[Request],
                   weights: Sequence[float] = SERVICE_WEIGHTS) -> tuple[np.ndarray, np.ndarray]:
    """(times, weighted tokens served at each time), sorted by time."""
    times: list[float] = []
    amounts: list[float] = []
    for r in requests:
        tt = r.metrics.token_times
        if not tt:
            continue
        times += tt
        amounts += [weights[1]] * len(tt)
        amounts[len(amounts) - len(tt)] += weights[0] * r.num_prompt_tokens
    t = np.asarray(times, dtype=float)
    order = np.argsort(t, kind="stable")
    return t[order], np.asarray(amounts, dtype=float)[order]


def service_rates(by_client: Mapping[str, Sequence[Request]], end: float,
                  weights: Sequence[float] = SERVICE_WEIGHTS) -> dict[str, float]:
    """Each client's weighted tokens served per second of its backlog (clients never
    backlogged, e.g. all rejected on arrival, are left out)."""
    out = {}
    for c, reqs in by_client.items():
        busy = sum(b - a for a, b in backlog(reqs, end))
        if busy > 0:
            out[c] = float(service_events(reqs, weights)[1].sum()) / busy
    return out


def max_service_difference(by_client: Mapping[str, Sequence[Request]], end: float,
                           weights: Sequence[float] = SERVICE_WEIGHTS) -> float | None:
    """VTC's maximum service difference between two backlogged clients (see the module
    docstring), in weighted tokens. None with fewer than two clients."""
    clients = sorted(by_client)
    if len(clients) < 2:
        return None
    spans = {c: backlog(by_client[c], end) for c in clients}
    events = {c: service_events(by_client[c], weights) for c in clients}
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


def _spread(ef: tuple[np.ndarray, np.ndarray], eg: tuple[np.ndarray, np.ndarray],
            a: float, b: float) -> float:
    """max - min over t in [a, b] of W_f(a, t) - W_g(a, t): the largest |difference| over any
    sub-interval."""
    parts_t, parts_v = [], []
    for (t, v), sign in ((ef, 1.0), (eg, -1.0)):
        keep = (t > a) & (t <= b)
        parts_t.append(t[keep])
        parts_v.append(sign * v[keep])
    t = np.concatenate(parts_t)
    if not len(t):
        return 0.0
    v = np.concatenate(parts_v)
    # NOTE: service at one instant (one step) counts at once: no spike between two clients'
    # tokens of the same step
    times, first = np.unique(t, return_inverse=True)
    per_time = np.zeros(len(times))
    np.add.at(per_time, first, v)
    d = np.concatenate([[0.0], np.cumsum(per_time)])
    return float(d.max() - d.min())


def service(request: Request, weights: Sequence[float] = SERVICE_WEIGHTS) -> float:
    """Weighted tokens served to one request so far."""
    if not request.metrics.token_times:
        return 0.0
    return weights[0] * request.num_prompt_tokens + weights[1] * request.num_output_tokens


def group_metrics(requests: Sequence[Request], duration: float, start_time: float,
                  percentiles: Sequence[float] = (50, 90, 99),
                  slo: Mapping[str, float] | None = None,
                  weights: Sequence[float] = SERVICE_WEIGHTS) -> dict[str, Any]:
    """Per-client and per-SLO-class summaries, present only when the workload has them.

    Returns:
        `per_client` / `per_slo_class`: name -> {num_requests, completed, num_rejected,
        input/output tokens, `service`, `request_throughput`, `request_goodput` (completed
        requests meeting `slo` and their deadline, per s), `deadline_attainment` (share of all
        its requests that met their deadline; None without deadlines), TTFT/TPOT mean and
        percentiles (ms)};
        `service_timeline` {t_s, clients: name -> service per second in each bin};
        `jain_fairness_index` over the clients' service rates while backlogged and
        `max_service_difference` (see the module docstring);
        `deadline_attainment` over all requests with a deadline.
    """
    out: dict[str, Any] = {}
    if any(r.client_id is not None for r in requests):
        by_client = _split(requests, "client_id")
        out["per_client"] = {c: _group(rs, duration, percentiles, slo, weights)
                             for c, rs in by_client.items()}
        end = start_time + duration
        out["jain_fairness_index"] = jain_index(service_rates(by_client, end, weights).values())
        out["max_service_difference"] = max_service_difference(by_client, end, weights)
        out["service_timeline"] = service_timeline(by_client, duration, start_time, weights)
    if any(r.slo_class is not None for r in requests):
        out["per_slo_class"] = {c: _group(rs, duration, percentiles, slo, weights)
                                for c, rs in _split(requests, "slo_class").items()}
    with_deadline = [r for r in requests if r.deadline_ms is not None]
    if with_deadline:
        out["deadline_attainment"] = sum(map(_met_deadline, with_deadline)) / len(with_deadline)
    return out


def service_timeline(by_client: Mapping[str, Sequence[Request]], duration: float,
                     start_time: float, weights: Sequence[float] = SERVICE_WEIGHTS,
                     num_bins: int = NUM_TIMELINE_BINS) -> dict[str, Any]:
    """Service per second each client received in `num_bins` equal bins of the run."""
    width = duration / num_bins if duration > 0 else 1.0
    series = {}
    for c, reqs in by_client.items():
        acc = np.zeros(num_bins)
        for r in reqs:
            times = r.metrics.token_times
            if not times:
                continue
            b = np.clip(((np.asarray(times) - start_time) / width).astype(int), 0, num_bins - 1)
            np.add.at(acc, b, weights[1])
            acc[b[0]] += weights[0] * r.num_prompt_tokens
        series[c] = (acc / width).tolist()
    return {"t_s": [(i + 1) * width for i in range(num_bins)], "clients": series}


def _split(requests: Sequence[Request], attr: str) -> dict[str, list[Request]]:
    groups: dict[str, list[Request]] = {}
    for r in requests:
        v = getattr(r, attr)
        groups.setdefault(NONE if v is None else str(v), []).append(r)
    return dict(sorted(groups.items()))


def is_completed(r: Request) -> bool:
    """Whether a request ended normally with at least one token (vLLM's "completed")."""
    return r.status in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH) and bool(
        r.metrics.token_times)


def per_second(n: float, duration: float) -> float:
    return n / duration if duration > 0 else 0.0


def percentile_keys(name: str, values_ms: np.ndarray, percentiles: Sequence[float]
                    ) -> dict[str, float]:
    """`p50_<name>_ms`-style keys (vLLM's) of a series already in ms."""
    out = {}
    for p in percentiles:
        word = str(int(p)) if float(p).is_integer() else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(values_ms, p))
    return out


def since_arrival(r: Request, t: float | None) -> float:
    """Seconds from the request's arrival to `t`, one of its timestamps that a completed
    request has (first scheduled, first token, finished)."""
    assert t is not None, f"request {r.request_id} lacks a timestamp a completed one has"
    return t - r.metrics.arrival_time


def _ttft(r: Request) -> float:
    return since_arrival(r, r.metrics.first_token_time)


def _met_deadline(r: Request) -> bool:
    return (is_completed(r) and r.deadline_ms is not None
            and _ttft(r) * 1000.0 <= r.deadline_ms)


def meets_slo(r: Request, slo: Mapping[str, float]) -> bool:
    """Whether a completed request meets every `slo` limit (ms on "ttft", "tpot", "e2el").

    NOTE: as in vLLM, a one-token request has TPOT 0 for goodput.
    """
    ttft = _ttft(r)
    e2el = since_arrival(r, r.metrics.finished_time)
    tpot = (e2el - ttft) / (r.num_output_tokens - 1) if r.num_output_tokens > 1 else 0.0
    got = {"ttft": ttft, "tpot": tpot, "e2el": e2el}
    return all(got[k] * 1000.0 <= limit for k, limit in slo.items())


def _good(r: Request, slo: Mapping[str, float] | None) -> bool:
    if r.deadline_ms is not None and not _met_deadline(r):
        return False
    return not slo or meets_slo(r, slo)


def _group(reqs: list[Request], duration: float, percentiles: Sequence[float],
           slo: Mapping[str, float] | None, weights: Sequence[float]) -> dict[str, Any]:
    done = [r for r in reqs if is_completed(r)]

    def per_s(n: float) -> float:
        return per_second(n, duration)

    deadlines = [r for r in reqs if r.deadline_ms is not None]
    g: dict[str, Any] = {
        "num_requests": len(reqs),
        "completed": len(done),
        "num_rejected": sum(r.status is RequestStatus.REJECTED for r in reqs),
        "total_input_tokens": sum(r.num_prompt_tokens for r in done),
        "total_output_tokens": sum(r.num_output_tokens for r in done),
        "service": sum(service(r, weights) for r in reqs),
        "request_throughput": per_s(len(done)),
        "request_goodput": per_s(sum(_good(r, slo) for r in done)),
        "deadline_attainment": (sum(map(_met_deadline, deadlines)) / len(deadlines)
                                if deadlines else None),
    }
    ttfts = [_ttft(r) for r in done]
    tpots = [(since_arrival(r, r.metrics.finished_time) - _ttft(r)) / (r.num_output_tokens - 1)
             for r in done if r.num_output_tokens > 1]
    for name, xs in (("ttft", ttfts), ("tpot", tpots)):
        a = np.asarray(xs if xs else [0.0]) * 1000.0
        g[f"mean_{name}_ms"] = float(a.mean())
        g.update(percentile_keys(name, a, percentiles))
    return g
