"""Virtual token counter: fair sharing of service between clients ("Fairness in Serving Large
Language Models", Sheng et al., OSDI'24)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from schedlab.queue import RequestQueue
from schedlab.request import Request

if TYPE_CHECKING:
    from schedlab.kv_manager import KVCacheManager

#: the client of requests that carry no `client_id`
ANONYMOUS = "<none>"


def client_of(request: Request) -> str:
    return ANONYMOUS if request.client_id is None else str(request.client_id)


class _Books:
    """One instance's service books: every client's counter and who waits (in any of the
    instance's VTC queues), so that a client is lifted only when it starts waiting there."""

    __slots__ = ("counters", "waiting", "last_left")

    def __init__(self) -> None:
        #: service so far per client (all clients ever seen)
        self.counters: dict[str, float] = {}
        #: client -> its requests waiting in the instance's VTC queues (backlogged clients only)
        self.waiting: dict[str, int] = {}
        self.last_left: str | None = None

    def arrive(self, client: str) -> None:
        """One of `client`'s requests waits; a client that becomes backlogged has its counter
        lifted to the smallest counter among the backlogged clients, or, with none
        backlogged, to the counter of the client that left last. Changes state."""
        if client not in self.waiting:
            if self.waiting:
                floor = min(self.counters[c] for c in self.waiting)
            elif self.last_left is not None:
                floor = self.counters.get(self.last_left, 0.0)
            else:
                floor = 0.0
            self.counters[client] = max(self.counters.get(client, 0.0), floor)
            self.waiting[client] = 0
        self.waiting[client] += 1

    def leave(self, client: str) -> None:
        """One of `client`'s requests no longer waits. Changes state."""
        left = self.waiting[client] - 1
        if left:
            self.waiting[client] = left
        else:
            del self.waiting[client]
            self.last_left = client


#: KV manager -> the books of the VTC queues bound to it (one instance's)
_BOOKS: WeakKeyDictionary[KVCacheManager, _Books] = WeakKeyDictionary()


class VTCQueue(RequestQueue):
    """The waiting request of the client that has received the least service goes next.

    Every client (`Request.client_id`) has a virtual counter of the service it received:
    `input_weight` per prompt token, charged when one of its requests is admitted (popped),
    plus `output_weight` per output token, charged as the token is produced (`on_token`). The
    next request is the earliest waiting one of the backlogged client with the smallest
    counter (ties: the client whose head arrived first). A client that becomes backlogged
    (its first waiting request) has its counter lifted to the smallest counter among the
    backlogged clients, or, with none backlogged, to the counter of the client that left the
    queue last: idle time earns no credit (the paper's Algorithm 2). This keeps the service
    difference between two backlogged clients bounded (the paper's 2x bound).

    A preempted request goes back to the front of its client's queue and is not charged for
    its prompt again. The preemption victim is a running request of the client with the
    largest counter, then the latest arrival. VTC never preempts for an arrival.

    One counter per client per instance: the VTC queues bound to one KV manager (the engine's
    own and, on a decode instance, the one its arrived KV transfers wait in) share their books.
    A request admitted with output already produced elsewhere (its first token, on a prefill
    instance) is charged for those tokens with its prompt, so a decode instance's counters are
    what one engine's would be: the weighted prompt and output tokens of each client.

    Args:
        input_weight: counter units per prompt token (the paper's w_p; default 1).
        output_weight: counter units per output token (w_q; the paper uses 2).
    """

    def __init__(self, input_weight: float = 1.0, output_weight: float = 2.0,
                 **options: object) -> None:
        super().__init__(**options)
        for name, w in (("input_weight", input_weight), ("output_weight", output_weight)):
            if isinstance(w, bool) or not isinstance(w, int | float) or not w >= 0:
                raise ValueError(f"{name}={w!r} must be a number >= 0")
        self.input_weight = float(input_weight)
        self.output_weight = float(output_weight)
        self._books = _Books()
        #: whether `on_token` counts (the first queue bound to the instance's KV does: the
        #: scheduler tells it every token the instance produces)
        self._counts_tokens = True
        self._queues: dict[str, deque[Request]] = {}  # backlogged clients only, FCFS each
        self._charged: set[int] = set()  # id() of waiting requests whose prompt was charged
        self._len = 0

    @property
    def counters(self) -> dict[str, float]:
        """Service so far per client (all clients ever seen), the instance's."""
        return self._books.counters

    def bind(self, kv: KVCacheManager) -> None:
        """Keep the books of the instance `kv` belongs to: the first VTC queue bound to it
        starts them, a later one (the decode side's queue of arrived KV transfers) shares
        them. Bind before use. Changes state."""
        books = _BOOKS.setdefault(kv, self._books)
        if books is not self._books:
            assert not self._len and not self._books.counters, "bind() before use"
            self._books, self._counts_tokens = books, False

    # ---- service accounting ----------------------------------------------------------------
    def on_token(self, request: Request) -> None:
        if self._counts_tokens:  # NOTE: else the instance's first queue counts it
            c = client_of(request)
            self.counters[c] = self.counters.get(c, 0.0) + self.output_weight

    def _charge(self, request: Request) -> float:
        """What admitting `request` costs its client: its prompt, and any output it brings."""
        return (self.input_weight * request.num_prompt_tokens
                + self.output_weight * request.num_output_tokens)

    def _next_client(self) -> str:
        if not self._queues:
            raise IndexError("the queue is empty")
        return min(self._queues, key=lambda c: (self.counters[c],
                                                self._queues[c][0].arrival_time))

    # ---- the queue -------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        c = client_of(request)
        self._books.arrive(c)
        self._queues.setdefault(c, deque()).append(request)
        self._len += 1

    def _take(self, c: str, q: deque[Request]) -> Request:
        req = q.popleft()
        self._len -= 1
        if not q:
            del self._queues[c]
        self._books.leave(c)
        return req

    def pop(self) -> Request:
        c = self._next_client()
        req = self._take(c, self._queues[c])
        if id(req) in self._charged:
            self._charged.discard(id(req))
        else:
            self.counters[c] += self._charge(req)
        return req

    def peek(self) -> Request:
        return self._queues[self._next_client()][0]

    def prepend(self, request: Request) -> None:
        c = client_of(request)
        self._books.arrive(c)
        self._queues.setdefault(c, deque()).appendleft(request)
        self._charged.add(id(request))
        self._len += 1

    def remove(self, request: Request) -> None:
        c = client_of(request)
        q = self._queues.get(c, deque())
        for i, r in enumerate(q):
            if r is request:
                del q[i]
                self._len -= 1
                if not q:
                    del self._queues[c]
                self._books.leave(c)
                self._charged.discard(id(request))
                return
        raise ValueError(f"request {request.request_id} is not in the queue")

    def select_victim(self, candidates: Iterable[Request]) -> Request:
        return max(candidates, key=lambda r: (self.counters.get(client_of(r), 0.0),
                                              r.arrival_time, r.request_id))

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Request]:
        """The admission order if nothing else happened: each pop charges its prompt."""
        counters = {c: self.counters[c] for c in self._queues}
        pos = dict.fromkeys(self._queues, 0)
        for _ in range(self._len):
            c = min(pos, key=lambda c: (counters[c], self._queues[c][pos[c]].arrival_time))
            req = self._queues[c][pos[c]]
            yield req
            if id(req) not in self._charged:
                counters[c] += self._charge(req)
            pos[c] += 1
            if pos[c] == len(self._queues[c]):
                del pos[c]

    def check_integrity(self) -> None:
        super().check_integrity()
        assert self._len == sum(len(q) for q in self._queues.values()), "length disagrees"
        for c, q in self._queues.items():
            assert q, f"client {c} is backlogged with an empty queue"
            assert c in self.counters, f"client {c} has no counter"
            assert all(client_of(r) == c for r in q), f"a request is filed under client {c}"
            assert self._books.waiting.get(c, 0) >= len(q), f"client {c} waits unbooked"
        waiting = {id(r) for q in self._queues.values() for r in q}
        assert self._charged <= waiting, "a charged mark outlived its request"
        assert all(v >= 0 for v in self.counters.values()), "a negative counter"
