"""The ordering-policy seam: which waiting request goes next, and nothing else."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, NamedTuple

from schedlab.request import Request

if TYPE_CHECKING:
    from schedlab.kv_manager import KVCacheManager


class Dropped(NamedTuple):
    """A waiting request a policy gives up on (`RequestQueue.expire`), and why."""

    request: Request
    reason: str


class RequestQueue(ABC):
    """Orders the waiting requests (vLLM V1's `RequestQueue`).

    A policy plugin decides order only; admission, the token budget and KV live in the
    scheduler. Besides ordering the waiting queue, a policy names the preemption victim,
    so "who waits longest" and "who is evicted first" agree.

    Four optional hooks (defaults: do nothing) let fairness and SLO policies act without the
    scheduler knowing them: `accept` (refuse an arrival, e.g. a rate limit), `on_token`
    (count served tokens, e.g. VTC), `outranks` (a waiting request may preempt a running
    one when KV is short, e.g. priority) and `expire` (give up on hopeless waiting requests,
    e.g. EDF past a deadline).
    """

    def __init__(self, **options: object) -> None:
        if options:
            raise TypeError(f"{type(self).__name__} takes no options, got {sorted(options)}")

    def bind(self, kv: KVCacheManager) -> None:  # noqa: B027 (an optional hook)
        """Give the policy read access to the KV manager (the scheduler calls this once, when
        it is built). Changes state.

        A cache-aware policy (longest prefix match) keeps `kv` and may call
        `kv.match_prefix(request)`; the default ignores it.
        """

    @abstractmethod
    def add(self, request: Request) -> None:
        """Insert a new request at its place in the order. Changes state."""

    @abstractmethod
    def pop(self) -> Request:
        """Remove and return the next request. Changes state.

        Raises:
            IndexError: the queue is empty.
        """

    @abstractmethod
    def peek(self) -> Request:
        """Return the next request without removing it.

        Raises:
            IndexError: the queue is empty.
        """

    @abstractmethod
    def prepend(self, request: Request) -> None:
        """Put back a request that was taken out (a preempted one) so it goes early.
        Changes state."""

    @abstractmethod
    def remove(self, request: Request) -> None:
        """Remove a specific request (an abort). Changes state.

        Raises:
            ValueError: the request is not in the queue.
        """

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """The queued requests in policy order. No state change."""

    def select_victim(self, candidates: Iterable[Request]) -> Request:
        """Pick which running request to preempt when KV runs out. No state change.

        Default: the latest arrival goes first (vLLM's FCFS rule). Policies override it.
        """
        return max(candidates, key=lambda r: (r.arrival_time, r.request_id))

    def accept(self, request: Request) -> str | None:
        """Whether the policy takes a new arrival, before `add`. Changes state (a policy may
        count the arrival).

        Returns:
            None to queue it; else the reason it is refused (the scheduler then ends it
            REJECTED with that reason). Default: every request is taken.
        """
        return None

    def on_token(self, request: Request) -> None:  # noqa: B027 (an optional hook)
        """A running request received an output token (its first one: its prompt was served
        too). Changes state (service counters); the default ignores it."""

    def outranks(self, waiting: Request, running: Request) -> bool:
        """Whether `waiting` may preempt `running` when it cannot be admitted for lack of KV.
        No state change.

        Default: never (FCFS behaviour: an arrival waits for KV). A policy that says yes must
        also order `waiting` before `running` would be, and should answer with a strict
        order (never both ways), so two requests cannot preempt each other in turn.
        """
        return False

    def expire(self, now: float) -> list[Dropped]:
        """Remove and return the waiting requests the policy gives up on at time `now` (the
        engine clock, s); the scheduler ends each REJECTED with its reason. Changes state.

        Default: none (a request waits until it runs).
        """
        return []

    def check_integrity(self) -> None:
        """Raise AssertionError if the queue's internal state is inconsistent."""
        seen = set()
        for r in self:
            assert id(r) not in seen, f"request {r.request_id} queued twice"
            seen.add(id(r))
        assert len(seen) == len(self), "queue length disagrees with its contents"

    def __bool__(self) -> bool:
        return len(self) > 0


def overrides_hook(queue: RequestQueue, hook: str) -> bool:
    """Whether `queue` has its own `hook`, not `RequestQueue`'s default (class or instance), so
    a caller may skip calling a no-op per request. No state change."""
    return (getattr(type(queue), hook) is not getattr(RequestQueue, hook)
            or hook in getattr(queue, "__dict__", ()))
