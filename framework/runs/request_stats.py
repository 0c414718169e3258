"""What a run's metrics keep of each request once it ended: a few numbers in arrays, indexed
by the request's position in the workload.

A streaming run (`driver.save_detailed=false`) files each request here when it ends and
forgets the request; a detailed run files its requests here at the end. `compute_metrics`
reads only this, so both give the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from schedlab.request import Request, RequestStatus
from schedlab.runs.groups import is_completed, since_arrival

#: `RequestStats.status` values
OPEN, COMPLETED, REJECTED, FAILED = 0, 1, 2, 3


class RequestStats:
    """The ended requests of a run of `num_requests`, as arrays (entries of requests not
    filed are `OPEN` and count nowhere).

    Args:
        num_requests: the workload's size (the positions `add` takes).
        start_time: the run's start on the engine clock (for the per-second token counts).
    """

    def __init__(self, num_requests: int, start_time: float) -> None:
        n = num_requests
        self.start_time = start_time
        self.status = np.zeros(n, np.int8)
        #: arrival and end of every ended request (vLLM's in-flight window)
        self.arrival = np.zeros(n)
        self.finished = np.full(n, np.nan)
        #: seconds since arrival, of completed requests
        self.ttft = np.zeros(n)
        self.e2el = np.zeros(n)
        self.queue = np.zeros(n)
        self.num_input = np.zeros(n, np.int64)
        self.num_output = np.zeros(n, np.int64)
        #: each completed request's inter-token gaps: `_itl[itl_at[k]: itl_at[k] + num_itl[k]]`
        self.itl_at = np.zeros(n, np.int64)
        self.num_itl = np.zeros(n, np.int64)
        self._itl = np.empty(max(16, n))
        self._itl_len = 0
        #: output tokens per whole second of the run, from second `_first_second`
        self._per_second = np.zeros(0, np.int64)
        self._first_second = 0
        #: why each request that did not complete ended, by position
        self.errors: dict[int, str | None] = {}

    @classmethod
    def of(cls, requests: Sequence[Request], start_time: float) -> RequestStats:
        """The stats of ended requests, by their position in `requests`."""
        stats = cls(len(requests), start_time)
        for k, r in enumerate(requests):
            stats.add(k, r)
        return stats

    def add(self, k: int, r: Request) -> None:
        """File request `r`, ended, as position `k`. Changes state."""
        m = r.metrics
        if m.finished_time is not None:
            self.arrival[k] = r.arrival_time
            self.finished[k] = m.finished_time
        if not is_completed(r):
            self.status[k] = REJECTED if r.status is RequestStatus.REJECTED else FAILED
            self.errors[k] = r.reject_reason or r.finish_reason
            return
        self.status[k] = COMPLETED
        self.ttft[k] = since_arrival(r, m.first_token_time)
        self.e2el[k] = since_arrival(r, m.finished_time)
        self.queue[k] = since_arrival(r, m.first_scheduled_time)
        self.num_input[k] = r.num_prompt_tokens
        self.num_output[k] = r.num_output_tokens
        times = np.asarray(m.token_times)
        gaps = np.diff(times)
        end = self._itl_len + len(gaps)
        if end > len(self._itl):
            grown = np.empty(max(end, 2 * len(self._itl)))
            grown[: self._itl_len] = self._itl[: self._itl_len]
            self._itl = grown
        self._itl[self._itl_len:end] = gaps
        self.itl_at[k], self.num_itl[k] = self._itl_len, len(gaps)
        self._itl_len = end
        self._count_seconds(np.floor(times - self.start_time).astype(np.int64))

    def _count_seconds(self, seconds: np.ndarray) -> None:
        if not len(seconds):
            return
        lo, hi = int(seconds.min()), int(seconds.max())
        counts, first = self._per_second, self._first_second
        if not len(counts):
            counts, first = np.zeros(hi - lo + 1, np.int64), lo
        if lo < first or hi >= first + len(counts):
            new_first = min(lo, first)
            grown = np.zeros(max(hi, first + len(counts) - 1) - new_first + 1, np.int64)
            grown[first - new_first: first - new_first + len(counts)] = counts
            counts, first = grown, new_first
        counts += np.bincount(seconds - first, minlength=len(counts))
        self._per_second, self._first_second = counts, first

    # ---- what metrics read (no state change) ---------------------------------------------
    @property
    def completed(self) -> np.ndarray:
        """Positions of the completed requests, in workload order."""
        return np.flatnonzero(self.status == COMPLETED)

    def count(self, status: int) -> int:
        return int(np.count_nonzero(self.status == status))

    def num_ended(self) -> int:
        return int(np.count_nonzero(self.status != OPEN))

    def tpots(self, done: np.ndarray) -> np.ndarray:
        """TPOT of the completed requests `done` (NaN for one-token outputs)."""
        n = self.num_output[done]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (self.e2el[done] - self.ttft[done]) / (n - 1)
        return np.where(n > 1, t, np.nan)

    def pooled_itls(self, done: np.ndarray) -> np.ndarray:
        """Every inter-token gap of the requests `done`, request after request."""
        counts = self.num_itl[done]
        before = np.cumsum(counts) - counts
        idx = np.repeat(self.itl_at[done] - before, counts) + np.arange(int(counts.sum()))
        return self._itl[idx]

    def itls(self, done: np.ndarray) -> list[list[float]]:
        """Each completed request's gaps, as lists."""
        return [self._itl[a:a + c].tolist() for a, c in zip(self.itl_at[done].tolist(),
                                                            self.num_itl[done].tolist(),
                                                            strict=True)]

    def num_meeting(self, done: np.ndarray, slo: Mapping[str, float]) -> int:
        """Completed requests meeting every limit (ms) of `slo`; a one-token request has
        TPOT 0, as in vLLM."""
        tpot = np.nan_to_num(self.tpots(done), nan=0.0)
        got = {"ttft": self.ttft[done], "tpot": tpot, "e2el": self.e2el[done]}
        ok = np.ones(len(done), bool)
        for key, limit in slo.items():
            ok &= got[key] * 1000.0 <= limit
        return int(ok.sum())

    def peak_output_rate(self) -> float:
        """The most output tokens in one whole second of the run (vLLM's
        `max_output_tokens_per_s`)."""
        return float(self._per_second.max()) if len(self._per_second) else 0.0

    def peak_in_flight(self) -> int:
        """The most ended requests in flight at once, arrival to end (an end at t and an
        arrival at t do not overlap)."""
        ended = ~np.isnan(self.finished)
        times = np.concatenate([self.arrival[ended], self.finished[ended]])
        deltas = np.concatenate([np.ones(int(ended.sum()), np.int64),
                                 -np.ones(int(ended.sum()), np.int64)])
        order = np.lexsort((deltas, times))  # by time, an end (-1) before an arrival
        running = np.cumsum(deltas[order])
        return max(0, int(running.max())) if len(running) else 0
