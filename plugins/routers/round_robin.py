"""Round robin: instance 0, 1, ..., n-1, 0, ... regardless of load."""

from __future__ import annotations

from collections.abc import Sequence

from schedlab.cluster.router import InstanceLoad, Router
from schedlab.request import Request


class RoundRobinRouter(Router):
    """Sends the k-th request to instance k mod n (vLLM's and SGLang's baseline)."""

    def __init__(self, **options: object) -> None:
        super().__init__(**options)
        self._next = 0

    def bind(self, num_instances: int) -> None:
        super().bind(num_instances)
        self._next = 0

    def select(self, request: Request, loads: Sequence[InstanceLoad]) -> int:
        i = self._next % len(loads)
        self._next = (i + 1) % len(loads)
        return i

    def static_routes(self, num_requests: int) -> list[int]:
        n, first = self.num_instances, self._next
        return [(first + k) % n for k in range(num_requests)]

    def check_integrity(self) -> None:
        super().check_integrity()
        assert 0 <= self._next < self.num_instances, f"cursor {self._next} outside the pool"
