"""Priority order: lower `Request.priority` first, first come first served among equals."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator

from schedlab.queue import RequestQueue
from schedlab.request import Request


class PriorityQueue(RequestQueue):
    """Lowest `priority` value first; ties go by arrival time, then submission order.

    A preempted request goes back to its place by the same key, which is early among its
    equals since it arrived before anything admitted after it (vLLM V1's priority queue). The
    preemption victim is the opposite end: the highest value, then the latest arrival.

    A waiting request outranks a running one of a strictly higher `priority` value: when KV
    is short at admission, the scheduler preempts the lower one for it (`outranks`).

    Args:
        aging_rate: anti-starvation aging, in priority levels per second of waiting (0: off).
            A request's effective priority is `priority - aging_rate * wait`; since every
            waiting request ages at the same rate, this orders by the static key
            `priority + aging_rate * arrival_time`: a request that waited 1 / aging_rate
            seconds longer goes ahead of one level better. Preemption still compares plain
            `priority`, so aging never makes two requests preempt each other in turn.
    """

    def __init__(self, aging_rate: float = 0.0, **options: object) -> None:
        super().__init__(**options)
        if isinstance(aging_rate, bool) or not isinstance(aging_rate, int | float) \
                or not aging_rate >= 0:
            raise ValueError(f"aging_rate={aging_rate!r} must be a number >= 0")
        self.aging_rate = float(aging_rate)
        self._heap: list[tuple[tuple, int, Request]] = []  # (key, submission order, request)
        self._seq = itertools.count()

    def _key(self, request: Request) -> tuple:
        """The order: smaller goes first. Subclasses with another order override only this."""
        return self._aged(request.priority, request), request.arrival_time

    def _aged(self, value: float, request: Request) -> float:
        """`value` less the aging credit (see the class docstring)."""
        return value + self.aging_rate * request.arrival_time if self.aging_rate else value

    def outranks(self, waiting: Request, running: Request) -> bool:
        return waiting.priority < running.priority

    def add(self, request: Request) -> None:
        heapq.heappush(self._heap, (self._key(request), next(self._seq), request))

    def pop(self) -> Request:
        if not self._heap:
            raise IndexError("pop from an empty queue")
        return heapq.heappop(self._heap)[-1]

    def peek(self) -> Request:
        if not self._heap:
            raise IndexError("peek from an empty queue")
        return self._heap[0][-1]

    def prepend(self, request: Request) -> None:
        self.add(request)

    def remove(self, request: Request) -> None:
        for i, entry in enumerate(self._heap):
            if entry[-1] is request:
                self._heap.pop(i)
                heapq.heapify(self._heap)
                return
        raise ValueError(f"request {request.request_id} is not in the queue")

    def select_victim(self, candidates: Iterable[Request]) -> Request:
        return max(candidates, key=lambda r: (self._key(r), r.request_id))

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[-1] for entry in sorted(self._heap, key=lambda e: e[:2]))

    def check_integrity(self) -> None:
        super().check_integrity()
        for i, entry in enumerate(self._heap):
            assert entry[0] == self._key(entry[-1]), f"{entry[-1].request_id} key is stale"
            for c in (2 * i + 1, 2 * i + 2):
                if c < len(self._heap):
                    assert self._heap[c][:2] >= entry[:2], "heap order broken"
