"""Engine clocks: the time requests and steps are stamped with, in seconds.

- `WallClock`: elapsed time (a real executor on its own machine);
- `VirtualClock`: simulated time that moves only when told (the simulator);
- `InstanceClock`: time that runs only while its instance steps, so N real instances stepped
  one after another in one process behave as N in parallel (a cluster of real executors);
- `PacedClock`: a virtual clock held to the wall clock, so a simulated engine can serve live
  clients (`schedlab serve executor=sim`);
- `CPUTimeClock`: this thread's CPU time, so calibration measures a real executor without the
  time other processes take from a shared machine.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable

#: how a measurement reads time: "wall" (what a user sees) or "cpu" (this thread's CPU time)
TIMERS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}


class Clock(ABC):
    """Engine time in seconds since the engine started."""

    @abstractmethod
    def now(self) -> float: ...

    @abstractmethod
    def sleep_until(self, t: float) -> None:
        """Wait until `t` (online driving: nothing to run before the next arrival)."""


class WallClock(Clock):
    def __init__(self) -> None:
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def sleep_until(self, t: float) -> None:
        dt = t - self.now()
        if dt > 0:
            time.sleep(dt)


class VirtualClock(Clock):
    """Simulated time: advances only when told to."""

    def __init__(self) -> None:
        self._t = 0.0

    def now(self) -> float:
        return self._t

    def advance(self, dt: float) -> None:
        self._t += dt

    def sleep_until(self, t: float) -> None:
        self._t = max(self._t, t)


class InstanceClock(Clock):
    """Time of one instance in a cluster of real (wall-clock) executors.

    The run loop calls `resume` before stepping the instance and `pause` after: time advances
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
        """Start counting time (the instance is about to step). Changes state."""
        if self._since is None:
            self._since = self._timer()

    def pause(self) -> None:
        """Stop counting time (the instance's step is done). Changes state."""
        self._t = self.now()
        self._since = None


class PacedClock(VirtualClock):
    """A virtual clock held to the wall clock: `advance(dt)` returns once the wall clock has
    caught up with the new simulated time, and `catch_up()` moves simulated time forward to
    the wall clock (time the server spent idle or on its own overhead).

    Each step thus lasts its simulated duration on the wall clock and simulated time never
    falls behind it: a client measures the simulated latencies plus the server's real
    overhead (HTTP, JSON, the event loop).
    """

    def __init__(self) -> None:
        super().__init__()
        self._wall0 = time.perf_counter()

    def wall(self) -> float:
        return time.perf_counter() - self._wall0

    def advance(self, dt: float) -> None:
        super().advance(dt)
        self._pace()

    def sleep_until(self, t: float) -> None:
        super().sleep_until(t)
        self._pace()

    def catch_up(self) -> None:
        """Simulated time := max(simulated time, wall time). Changes state."""
        super().sleep_until(self.wall())

    def _pace(self) -> None:
        ahead = self.now() - self.wall()
        if ahead > 0:
            time.sleep(ahead)


class CPUTimeClock(Clock):
    """Engine time that runs only while this thread computes; waits for arrivals jump.

    With torch on one thread every forward runs on the calling thread, so this clock measures
    the real executor without the time other processes take from a shared machine.
    """

    def __init__(self) -> None:
        self._t0 = time.thread_time()
        self._skipped = 0.0

    def now(self) -> float:
        return time.thread_time() - self._t0 + self._skipped

    def sleep_until(self, t: float) -> None:
        dt = t - self.now()
        if dt > 0:
            self._skipped += dt
