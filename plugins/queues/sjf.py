"""Shortest job first: the shortest known output, else the shortest prompt."""

from __future__ import annotations

from schedlab.plugins.queues.priority import PriorityQueue
from schedlab.request import Request


class SJFQueue(PriorityQueue):
    """Shortest job first; ties go by arrival time, then submission order.

    A job's length is `Request.expected_output_len` when the workload knows it (decode steps
    dominate a request's time), else its prompt length. Requests with a known output length
    go before those without (a known short job is the better bet). The preemption victim is
    the longest job, then the latest arrival.
    """

    def _key(self, request: Request) -> tuple:
        if request.expected_output_len is not None:
            return 0, request.expected_output_len, request.arrival_time
        return 1, request.num_prompt_tokens, request.arrival_time
