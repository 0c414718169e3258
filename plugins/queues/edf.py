"""Earliest deadline first, with an option to drop or demote requests that can no longer make
their deadline."""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from typing import Any

from schedlab.plugins.queues.priority import PriorityQueue
from schedlab.queue import Dropped
from schedlab.request import Request

ON_MISS = ("keep", "drop", "demote")


class EDFQueue(PriorityQueue):
    """The waiting request whose deadline comes first goes next.

    A request's deadline is `arrival_time + deadline_ms / 1000`: the latest time its first
    token should come (a TTFT objective; the queue decides when a request starts, not how fast
    it then decodes). A request without `deadline_ms` takes its SLO class's deadline from
    `class_deadlines_ms`; with neither it goes after every request with a deadline, first
    come first served. Ties go by arrival time.

    A waiting request is hopeless once its deadline is less than `slack_ms` away (by default:
    already passed). `on_miss` says what happens then, checked at the end of every step
    (`expire`):

    - `keep`: nothing; it keeps its place (plain EDF, which serves late requests first and
      can make every later one late too under overload);
    - `drop`: it leaves the queue and ends REJECTED with the reason (load shedding);
    - `demote`: it goes behind every request that can still make its deadline, and runs
      when nothing else waits (best effort).

    The preemption victim is the running request with the latest deadline; a preempted
    request (it has output already) goes back to the front and is never dropped or demoted.
    EDF never preempts for an arrival.

    Args:
        on_miss: `keep` | `drop` | `demote`.
        class_deadlines_ms: deadlines by `slo_class` for requests without `deadline_ms`.
        slack_ms: how close to its deadline a waiting request counts as hopeless.
    """

    def __init__(self, on_miss: str = "keep", class_deadlines_ms: Mapping[str, float] | None = None,
                 slack_ms: float = 0.0, **options: Any) -> None:
        super().__init__(**options)
        if on_miss not in ON_MISS:
            raise ValueError(f"on_miss={on_miss!r}; accepted: {', '.join(ON_MISS)}")
        if isinstance(slack_ms, bool) or not isinstance(slack_ms, int | float) or slack_ms < 0:
            raise ValueError(f"slack_ms={slack_ms!r} must be a number >= 0")
        deadlines = dict(class_deadlines_ms or {})
        for name, v in deadlines.items():
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise ValueError(f"class_deadlines_ms[{name!r}]={v!r} must be a positive number")
        self.on_miss = on_miss
        self.class_deadlines_ms = {str(k): float(v) for k, v in deadlines.items()}
        self.slack_s = float(slack_ms) / 1000.0
        self._demoted: set[int] = set()  # id() of queued requests past hope

    def deadline(self, request: Request) -> float:
        """The absolute deadline (engine clock, s); inf without one. No state change."""
        ms = request.deadline_ms
        if ms is None and request.slo_class is not None:
            ms = self.class_deadlines_ms.get(str(request.slo_class))
        return math.inf if ms is None else request.arrival_time + ms / 1000.0

    def _key(self, request: Request) -> tuple:
        # NOTE: a request that already has output (a preempted one) met or missed its deadline
        # already: it goes back first and is never given up on.
        deadline = -math.inf if request.output_token_ids else self.deadline(request)
        return id(request) in self._demoted, deadline, request.arrival_time

    def outranks(self, waiting: Request, running: Request) -> bool:
        return False

    def expire(self, now: float) -> list[Dropped]:
        if self.on_miss == "keep":
            return []
        out: list[Dropped] = []
        heap = self._heap
        while heap:
            demoted, deadline, _ = heap[0][0]
            if demoted or deadline - self.slack_s >= now or heap[0][-1].output_token_ids:
                break
            _, seq, req = heapq.heappop(heap)
            if self.on_miss == "drop":
                ms = 1000.0 * (now - req.arrival_time)
                out.append(Dropped(req, f"edf: dropped after waiting {ms:.0f} ms, past its "
                                        f"{1000.0 * (deadline - req.arrival_time):.0f} ms "
                                        "deadline for the first token"))
            else:
                self._demoted.add(id(req))
                heapq.heappush(heap, (self._key(req), seq, req))
        return out

    def pop(self) -> Request:
        req = super().pop()
        self._demoted.discard(id(req))
        return req

    def prepend(self, request: Request) -> None:
        self._demoted.discard(id(request))
        super().prepend(request)

    def remove(self, request: Request) -> None:
        super().remove(request)
        self._demoted.discard(id(request))

    def check_integrity(self) -> None:
        super().check_integrity()
        queued = {id(e[-1]) for e in self._heap}
        assert self._demoted <= queued, "a demoted mark outlived its request"
