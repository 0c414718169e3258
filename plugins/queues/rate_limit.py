"""A per-client request rate limit in front of FCFS (the RPM limits of hosted LLM APIs; the
baseline VTC is compared with)."""

from __future__ import annotations

from collections import deque

from schedlab.plugins.queues.fcfs import FCFSQueue
from schedlab.plugins.queues.vtc import client_of
from schedlab.request import Request


class RateLimitQueue(FCFSQueue):
    """First come first served, but a client may have at most `max_requests` requests
    accepted within any `window_s` seconds; an arrival over the limit is refused (it ends
    REJECTED with the reason, as an HTTP 429 would), whatever the load.

    The window slides over arrival times (`Request.arrival_time`), so the limit is the same
    under the real and the simulated clock. Refused requests do not count against the limit.

    Args:
        max_requests: requests accepted per client per window.
        window_s: the window length in seconds (60: requests per minute).
    """

    def __init__(self, max_requests: int = 60, window_s: float = 60.0,
                 **options: object) -> None:
        super().__init__(**options)
        if isinstance(max_requests, bool) or not isinstance(max_requests, int) \
                or max_requests < 1:
            raise ValueError(f"max_requests={max_requests!r} must be an integer >= 1")
        if isinstance(window_s, bool) or not isinstance(window_s, int | float) \
                or not window_s > 0:
            raise ValueError(f"window_s={window_s!r} must be a positive number")
        self.max_requests = max_requests
        self.window_s = float(window_s)
        self._accepted: dict[str, deque[float]] = {}  # client -> recent accepted arrivals

    def accept(self, request: Request) -> str | None:
        c = client_of(request)
        recent = self._accepted.setdefault(c, deque())
        t = request.arrival_time
        while recent and recent[0] <= t - self.window_s:
            recent.popleft()
        if len(recent) >= self.max_requests:
            return (f"rate_limit: client {c} is over its limit of {self.max_requests} "
                    f"requests per {self.window_s:g} s")
        recent.append(t)
        return None
