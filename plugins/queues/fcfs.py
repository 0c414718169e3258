"""First come, first served."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from schedlab.queue import RequestQueue
from schedlab.request import Request


class FCFSQueue(RequestQueue):
    """Arrival order; a preempted request goes back to the front."""

    def __init__(self, **options: object) -> None:
        super().__init__(**options)
        self._q: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._q.append(request)

    def pop(self) -> Request:
        return self._q.popleft()

    def peek(self) -> Request:
        if not self._q:
            raise IndexError("peek from an empty queue")
        return self._q[0]

    def prepend(self, request: Request) -> None:
        self._q.appendleft(request)

    def remove(self, request: Request) -> None:
        self._q.remove(request)

    def __len__(self) -> int:
        return len(self._q)

    def __bool__(self) -> bool:  # NOTE: asked on every step; the base's goes through len()
        return bool(self._q)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "__len__" in cls.__dict__ and "__bool__" not in cls.__dict__:
            cls.__bool__ = RequestQueue.__bool__  # type: ignore[method-assign]  # its own len()

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)
