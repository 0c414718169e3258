"""Real-time pacing of a virtual clock, so a simulated engine can serve live clients.

Under `executor=sim` each step lasts its simulated duration on the wall clock and simulated time
never falls behind the wall clock, so a client measures the simulated latencies plus the
server's real overhead (HTTP, JSON, the event loop).
"""

from __future__ import annotations

import time

from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.executor import VirtualClock


class PacedClock(VirtualClock):
    """A virtual clock held to the wall clock: `advance(dt)` returns once the wall clock has
    caught up with the new simulated time, and `catch_up()` moves simulated time forward to
    the wall clock (time the server spent idle or on its own overhead)."""

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


def build_engine(config: EngineConfig) -> Engine:
    """An engine for serving: as `Engine(config)`, but an executor on a virtual clock runs on a
    `PacedClock` (real-time pacing of the simulated step times)."""
    engine = Engine(config)
    if isinstance(engine.clock, VirtualClock):
        engine.set_clock(PacedClock())
    return engine
