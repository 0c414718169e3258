"""Per-client and per-SLO-class metrics, Jain's fairness index of service, and the service
each client received over time (VTC's figures).

Service counts tokens the way the VTC paper does: `input_weight` per prompt token of a request
that got its first token (its prompt was served), plus `output_weight` per output token,
credited when the token was produced. A request's deadline (`Request.deadline_ms`) is an
objective for its first token: it is met when TTFT <= deadline.
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


def jain_index(values: Iterable[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1 when all equal, 1/n when one takes
    everything. None for no values or all zero."""
    x = np.asarray(list(values), dtype=float)
    sq = float((x * x).sum())
    return float(x.sum() ** 2 / (len(x) * sq)) if len(x) and sq > 0 else None


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
        percentiles (ms)}; `jain_fairness_index` over the clients' service;
        `service_timeline` {t_s, clients: name -> service per second in each bin};
        `deadline_attainment` over all requests with a deadline.
    """
    out: dict[str, Any] = {}
    if any(r.client_id is not None for r in requests):
        by_client = _split(requests, "client_id")
        out["per_client"] = {c: _group(rs, duration, percentiles, slo, weights)
                             for c, rs in by_client.items()}
        out["jain_fairness_index"] = jain_index(v["service"] for v in out["per_client"].values())
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
