"""The ordering-policy seam: which waiting request goes next, and nothing else."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from schedlab.request import Request

if TYPE_CHECKING:
    from schedlab.kv_manager import KVCacheManager


class RequestQueue(ABC):
    """Orders the waiting requests (vLLM V1's `RequestQueue`).

    A policy plugin decides order only; admission, the token budget and KV live in the
    scheduler. Besides ordering the waiting queue, a policy names the preemption victim,
    so "who waits longest" and "who is evicted first" agree.
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

    def check_integrity(self) -> None:
        """Raise AssertionError if the queue's internal state is inconsistent."""
        seen = set()
        for r in self:
            assert id(r) not in seen, f"request {r.request_id} queued twice"
            seen.add(id(r))
        assert len(seen) == len(self), "queue length disagrees with its contents"

    def __bool__(self) -> bool:
        return len(self) > 0
