"""Least loaded: the instance with the fewest outstanding tokens."""

from __future__ import annotations

from collections.abc import Sequence

from schedlab.cluster.router import InstanceLoad, Router
from schedlab.request import Request


class LeastLoadedRouter(Router):
    """Sends each request where the fewest tokens remain to be processed (prompt tokens not
    yet computed plus output tokens not yet generated); ties go to the fewest requests, then
    the lowest index. Llumnix's and Vidur's "least outstanding requests", counted in tokens."""

    def select(self, request: Request, loads: Sequence[InstanceLoad]) -> int:
        return self.least_loaded(loads)
