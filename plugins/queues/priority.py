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
    """

    def __init__(self, **options: object) -> None:
        super().__init__(**options)
        self._heap: list[tuple[tuple, int, Request]] = []  # (key, submission order, request)
        self._seq = itertools.count()

    def _key(self, request: Request) -> tuple:
        """The order: smaller goes first. Subclasses with another order override only this."""
        return request.priority, request.arrival_time

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
