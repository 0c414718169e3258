"""A per-instance clock for real executors: virtual time that runs only while its instance
works, so N instances stepped one after another in one process behave as N in parallel."""

from __future__ import annotations

from schedlab.executor import TIMERS, Clock


class InstanceClock(Clock):
    """Time of one instance in a cluster of real (wall-clock) executors.

    The cluster calls `resume` before stepping the instance and `pause` after: time advances
    with the timer in between and stands still otherwise (other instances' steps do not
    count). `sleep_until` jumps an idle instance forward, as a virtual clock does.

    Args:
        timer: `"wall"` (elapsed time; right on a machine of its own) or `"cpu"` (this
            thread's CPU time: other jobs on a shared machine do not count, as in
            `schedlab calibrate`; right only with torch on one thread, OMP_NUM_THREADS=1).
    """

    def __init__(self, timer: str = "wall") -> None:
        self._timer = TIMERS[timer]
        self._t = 0.0
        self._since: float | None = None

    def now(self) -> float:
        if self._since is None:
            return self._t
        return self._t + self._timer() - self._since

    def sleep_until(self, t: float) -> None:
        self._t = max(self.now(), t)
        if self._since is not None:
            self._since = self._timer()

    def resume(self) -> None:
        """Start counting wall time (the instance is about to step). Changes state."""
        if self._since is None:
            self._since = self._timer()

    def pause(self) -> None:
        """Stop counting wall time (the instance's step is done). Changes state."""
        self._t = self.now()
        self._since = None
