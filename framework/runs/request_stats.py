"""What a run's metrics keep of each request once it ended: a few numbers in arrays, indexed
by the request's position in the workload, and its token times in one shared buffer.

A streaming run (`driver.save_detailed=false`) files each request here when it ends and
forgets the request; a detailed run files its requests here at the end. `compute_metrics`
and the group figures (`schedlab.runs.groups`) read only this, so both give the same numbers.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from schedlab.request import Request, RequestStatus

#: `RequestStats.status` values
OPEN, COMPLETED, REJECTED, FAILED = 0, 1, 2, 3
#: `RequestStats.client` / `slo_class` of a request without one
NO_GROUP = -1
#: token times filed before they move into the run's buffer in one go
_PENDING_TIMES = 1 << 16
#: requests filed before their numbers are stored in the arrays in one go
_PENDING_ROWS = 4096
#: the arrays of `RequestStats` a filed request's row holds, in order (after its position)
_COLUMNS = ("_status", "_arrival", "_finished", "_ttft", "_e2el", "_queue", "_num_input",
            "_num_output", "_token_at", "_num_tokens", "_client", "_slo_class",
            "_deadline_ms")
_DONE = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)
_NAN = float("nan")


def is_completed(r: Request) -> bool:
    """Whether a request ended normally with at least one token (vLLM's "completed")."""
    return r.status in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH) and bool(
        r.metrics.token_times)


def since_arrival(r: Request, t: float | None) -> float:
    """Seconds from the request's arrival to `t`, one of its timestamps that a completed
    request has (first scheduled, first token, finished)."""
    assert t is not None, f"request {r.request_id} lacks a timestamp a completed one has"
    return t - r.metrics.arrival_time


class FiledChunk(NamedTuple):
    """Requests filed in one process, to be filed in another (`RequestStats.file_chunk`)."""

    #: one per request, as `RequestStats.add` makes them: token_at counts from `times`' start;
    #: client and slo_class index into `clients` and `slo_classes` (`NO_GROUP`: none)
    rows: list[tuple]
    #: the requests' token times, float64 bytes
    times: bytes
    #: why each request that did not complete ended, by position
    errors: dict[int, str | None]
    clients: list[str]
    slo_classes: list[str]


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
        # NOTE: each column's array is a property (below) that files the pending rows first
        self._status = np.zeros(n, np.int8)
        self._arrival = np.zeros(n)
        self._finished = np.full(n, np.nan)
        self._ttft = np.zeros(n)
        self._e2el = np.zeros(n)
        self._queue = np.zeros(n)
        self._num_input = np.zeros(n, np.int64)
        self._num_output = np.zeros(n, np.int64)
        self._token_at = np.zeros(n, np.int64)
        self._num_tokens = np.zeros(n, np.int64)
        self._times = np.empty(max(16, n))
        self._times_len = 0
        #: token times filed since they were last moved into `_times`, as doubles (in bulk:
        #: a numpy assignment's set-up per request costs more; and the floats are read once,
        #: not held: each is cold in cache by then, scattered over the run's memory)
        self._pending = array("d")
        self._client = np.full(n, NO_GROUP, np.int32)
        self._slo_class = np.full(n, NO_GROUP, np.int32)
        self._deadline_ms = np.full(n, np.nan)
        #: requests filed since their numbers were last stored in the arrays: one row each
        #: (position, then `_COLUMNS`' values), stored a column at a time in one numpy call
        #: (a numpy call per number per request was most of filing one)
        self._rows: list[tuple] = []
        self._client_codes: dict[str, int] = {}
        self._slo_class_codes: dict[str, int] = {}
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
        finished = m.finished_time
        client = (NO_GROUP if r.client_id is None
                  else _code(self._client_codes, r.client_id))
        slo_class = (NO_GROUP if r.slo_class is None
                     else _code(self._slo_class_codes, r.slo_class))
        deadline = _NAN if r.deadline_ms is None else r.deadline_ms
        times = m.token_times
        if times:
            pending = self._pending
            token_at, num_tokens = self._times_len + len(pending), len(times)
            num_input, num_output = len(r.prompt_token_ids), len(r.output_token_ids)
            if type(times) is list:
                pending.fromlist(times)
            else:
                pending.extend(times)
            if len(pending) >= _PENDING_TIMES:
                self._move_pending()
        else:
            token_at = num_tokens = num_input = num_output = 0
        if r.status in _DONE and times:  # NOTE: `is_completed`, inline
            status = COMPLETED
            ttft = since_arrival(r, m.first_token_time)
            e2el = since_arrival(r, finished)
            queue = since_arrival(r, m.first_scheduled_time)
        else:
            status = REJECTED if r.status is RequestStatus.REJECTED else FAILED
            self.errors[k] = r.reject_reason or r.finish_reason
            ttft = e2el = queue = 0.0
        rows = self._rows
        rows.append((k, status, m.arrival_time, _NAN if finished is None else finished, ttft,
                     e2el, queue, num_input, num_output, token_at, num_tokens, client,
                     slo_class, deadline))
        if len(rows) >= _PENDING_ROWS:
            self._store_rows()

    # ---- a run split over processes (`schedlab.cluster.parallel`) ---------------------------
    def file_chunk(self, chunk: FiledChunk) -> None:
        """File the requests another process filed (`schedlab.cluster.parallel`), as if each had
        been `add`ed here (the positions must not be filed yet). Changes state."""
        pending = self._pending
        offset = self._times_len + len(pending)
        pending.frombytes(chunk.times)
        clients = [_code(self._client_codes, c) for c in chunk.clients]
        classes = [_code(self._slo_class_codes, c) for c in chunk.slo_classes]
        rows = self._rows
        for row in chunk.rows:
            (k, status, arrival, finished, ttft, e2el, queue, num_input, num_output, token_at,
             num_tokens, client, slo_class, deadline) = row
            rows.append((k, status, arrival, finished, ttft, e2el, queue, num_input, num_output,
                         token_at + offset if num_tokens else 0, num_tokens,
                         clients[client] if client >= 0 else client,
                         classes[slo_class] if slo_class >= 0 else slo_class, deadline))
        self.errors.update(chunk.errors)
        if len(pending) >= _PENDING_TIMES:
            self._move_pending()
        if len(rows) >= _PENDING_ROWS:
            self._store_rows()

    def _store_rows(self) -> None:
        """Store the pending rows in the arrays. Changes state (not what it reads as)."""
        rows = self._rows
        if not rows:
            return
        self._rows = []
        cols = list(zip(*rows, strict=True))
        n = len(rows)
        at = np.fromiter(cols[0], np.int64, n)
        for name, col in zip(_COLUMNS, cols[1:], strict=True):
            dest = getattr(self, name)
            # NOTE: each value converted to the column's dtype as an item assignment does
            dest[at] = np.fromiter(col, dest.dtype, n)

    def _move_pending(self) -> None:
        """Append the pending token times to `_times`. Changes state (not what it reads as)."""
        pending = self._pending
        if not pending:
            return
        start = self._times_len
        end = start + len(pending)
        if end > len(self._times):
            grown = np.empty(max(end, 2 * len(self._times)))
            grown[:start] = self._times[:start]
            self._times = grown
        self._times[start:end] = np.frombuffer(pending, np.float64)
        self._times_len = end
        self._pending = array("d")

    # ---- the columns, by position (the pending rows stored first) ----------------------------
    @property
    def status(self) -> np.ndarray:
        """`OPEN`, `COMPLETED`, `REJECTED` or `FAILED`."""
        self._store_rows()
        return self._status

    @property
    def arrival(self) -> np.ndarray:
        """Arrival of every filed request."""
        self._store_rows()
        return self._arrival

    @property
    def finished(self) -> np.ndarray:
        """End of every ended request (NaN: it never ended)."""
        self._store_rows()
        return self._finished

    @property
    def ttft(self) -> np.ndarray:
        """Seconds since arrival to the first token, of completed requests."""
        self._store_rows()
        return self._ttft

    @property
    def e2el(self) -> np.ndarray:
        """Seconds since arrival to the end, of completed requests."""
        self._store_rows()
        return self._e2el

    @property
    def queue(self) -> np.ndarray:
        """Seconds since arrival to the first scheduling, of completed requests."""
        self._store_rows()
        return self._queue

    @property
    def num_input(self) -> np.ndarray:
        """Prompt tokens of every request that produced a token (0 otherwise)."""
        self._store_rows()
        return self._num_input

    @property
    def num_output(self) -> np.ndarray:
        """Output tokens of every request that produced a token (0 otherwise)."""
        self._store_rows()
        return self._num_output

    @property
    def token_at(self) -> np.ndarray:
        """Each request's token times: `_times[token_at[k]: token_at[k] + num_tokens[k]]`."""
        self._store_rows()
        return self._token_at

    @property
    def num_tokens(self) -> np.ndarray:
        self._store_rows()
        return self._num_tokens

    @property
    def client(self) -> np.ndarray:
        """Each request's client, as an index into `client_names` (`NO_GROUP`: none)."""
        self._store_rows()
        return self._client

    @property
    def slo_class(self) -> np.ndarray:
        """Each request's SLO class, as an index into `slo_class_names` (`NO_GROUP`)."""
        self._store_rows()
        return self._slo_class

    @property
    def deadline_ms(self) -> np.ndarray:
        """Each request's deadline (ms; NaN: none)."""
        self._store_rows()
        return self._deadline_ms

    def all_token_times(self) -> np.ndarray:
        """The buffer of every filed token time (see `token_at`), the pending ones moved into
        it first: a change of representation only, nothing a reader sees differs
        (`schedlab.runs.token_reads` reads it)."""
        self._move_pending()
        return self._times

    # ---- what metrics read (no state change but `all_token_times`' flush) --------------------
    @property
    def completed(self) -> np.ndarray:
        """Positions of the completed requests, in workload order."""
        return np.flatnonzero(self.status == COMPLETED)

    @property
    def filed(self) -> np.ndarray:
        """Positions of every filed request, in workload order."""
        return np.flatnonzero(self.status != OPEN)

    def count(self, status: int) -> int:
        return int(np.count_nonzero(self.status == status))

    def num_ended(self) -> int:
        return int(np.count_nonzero(self.status != OPEN))

    def completed_among(self, positions: np.ndarray) -> np.ndarray:
        """The completed requests of `positions`, in their order."""
        return positions[self.status[positions] == COMPLETED]

    def num_rejected_among(self, positions: np.ndarray) -> int:
        return int(np.count_nonzero(self.status[positions] == REJECTED))

    def client_names(self) -> list[str]:
        """Client ids by code (`client`)."""
        return list(self._client_codes)

    def slo_class_names(self) -> list[str]:
        """SLO classes by code (`slo_class`)."""
        return list(self._slo_class_codes)

    def tpots(self, done: np.ndarray) -> np.ndarray:
        """TPOT of the completed requests `done` (NaN for one-token outputs)."""
        n = self.num_output[done]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (self.e2el[done] - self.ttft[done]) / (n - 1)
        return np.where(n > 1, t, np.nan)

    def meeting(self, done: np.ndarray, slo: Mapping[str, float]) -> np.ndarray:
        """Whether each completed request of `done` meets every limit (ms) of `slo`; a
        one-token request has TPOT 0, as in vLLM."""
        tpot = np.nan_to_num(self.tpots(done), nan=0.0)
        got = {"ttft": self.ttft[done], "tpot": tpot, "e2el": self.e2el[done]}
        ok = np.ones(len(done), bool)
        for key, limit in slo.items():
            ok &= got[key] * 1000.0 <= limit
        return ok

    def has_objectives(self, slo: Mapping[str, float] | None) -> bool:
        """Whether a run's goodput has anything to count against: limits in `slo`, or a
        filed request with a deadline of its own. No state change."""
        return bool(slo) or bool((~np.isnan(self.deadline_ms[self.filed])).any())

    def good(self, done: np.ndarray, slo: Mapping[str, float] | None) -> np.ndarray:
        """Whether each completed request of `done` is goodput: it met its own deadline
        (when it has one) and every limit (ms) of `slo` (when given). The one definition of
        `request_goodput`, for the run and for each client and SLO class."""
        ok = np.isnan(self.deadline_ms[done]) | self.met_deadline(done)
        if slo:
            ok &= self.meeting(done, slo)
        return ok

    def met_deadline(self, done: np.ndarray) -> np.ndarray:
        """Whether each completed request of `done` got its first token by its deadline
        (False without one)."""
        return self.ttft[done] * 1000.0 <= self.deadline_ms[done]

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


def _code(codes: dict[str, int], value: object) -> int:
    """The code of group `value` (named by `str`, as the group keys are), new ones counted."""
    name = str(value)
    code = codes.get(name)
    if code is None:
        code = codes[name] = len(codes)
    return code
