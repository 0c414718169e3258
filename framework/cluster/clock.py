"""A per-instance clock for real executors: virtual time that runs only while its instance
works, so N instances stepped one after another in one process behave as N in parallel."""

from __future__ import annotations

import time

from schedlab.executor import Clock


class InstanceClock(Clock):
    """Time of one instance in a cluster of real (wall-clock) executors.

    The cluster calls `resume` before stepping the instance and `pause` after: time advances
    with the wall clock in between and stands still otherwise (other instances' steps do not
    count). `sleep_until` jumps an idle instance forward, as a virtual clock does.
    """

    def __init__(self) -> None:
        self._t = 0.0
        self._since: float | None = None

    def now(self) -> float:
        if self._since is None:
            return self._t
        return self._t + time.perf_counter() - self._since

    def sleep_until(self, t: float) -> None:
        self._t = max(self.now(), t)
        if self._since is not None:
            self._since = time.perf_counter()

    def resume(self) -> None:
        """Start counting wall time (the instance is about to step). Changes state."""
        if self._since is None:
            self._since = time.perf_counter()

    def pause(self) -> None:
        """Stop counting wall time (the instance's step is done). Changes state."""
        self._t = self.now()
        self._since = None
