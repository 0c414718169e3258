"""Longest prefix match first: cache-aware ordering, as SGLang's `lpm` policy."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from schedlab.kv_manager import KVCacheManager
from schedlab.queue import RequestQueue
from schedlab.request import Request


class LPMQueue(RequestQueue):
    """The waiting request with the most prompt tokens already in the prefix cache goes next.

    Running requests that share a prefix back to back keeps that prefix cached and raises the
    hit rate. Ties (and everything, without a prefix cache) go first come first served. A
    preempted request goes back to the front, ahead of the ordered rest, as in FCFS. The
    victim is the latest arrival (the default).

    The order is recomputed on every `peek`/`pop` through the KV manager the scheduler binds
    (`RequestQueue.bind`). Lookups (`KVCacheManager.match_prefix`) change nothing in the
    cache, so ordering never counts as reuse for eviction. Iteration (no state change) uses
    the match lengths of the last lookup.
    """

    def __init__(self, **options: object) -> None:
        super().__init__(**options)
        self._front: deque[Request] = deque()  # preempted, most recent first
        self._rest: list[Request] = []  # arrival order
        self._kv: KVCacheManager | None = None
        self._last: dict[int, int] = {}  # id(request) -> matched tokens at the last lookup

    def bind(self, kv: KVCacheManager) -> None:
        self._kv = kv

    def num_matched_tokens(self, request: Request) -> int:
        """Prompt tokens the prefix cache could skip for the request now (0 unbound)."""
        return 0 if self._kv is None else self._kv.match_prefix(request).num_tokens

    def _best(self) -> int:
        if not self._rest:
            raise IndexError("the queue is empty")
        if self._kv is None or self._kv.prefix_cache is None:
            return 0
        lengths = [self.num_matched_tokens(r) for r in self._rest]
        self._last = {id(r): n for r, n in zip(self._rest, lengths, strict=True)}
        return max(range(len(lengths)), key=lambda i: (lengths[i], -i))

    def add(self, request: Request) -> None:
        self._rest.append(request)

    def pop(self) -> Request:
        if self._front:
            return self._front.popleft()
        return self._rest.pop(self._best())

    def peek(self) -> Request:
        if self._front:
            return self._front[0]
        return self._rest[self._best()]

    def prepend(self, request: Request) -> None:
        self._front.appendleft(request)

    def remove(self, request: Request) -> None:
        for q in (self._front, self._rest):
            for i, r in enumerate(q):
                if r is request:
                    del q[i]
                    return
        raise ValueError(f"request {request.request_id} is not in the queue")

    def __len__(self) -> int:
        return len(self._front) + len(self._rest)

    def __iter__(self) -> Iterator[Request]:
        yield from self._front
        lengths = [self._last.get(id(r), 0) for r in self._rest]
        order = sorted(range(len(self._rest)), key=lambda i: (-lengths[i], i))
        yield from [self._rest[i] for i in order]
