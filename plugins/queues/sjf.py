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

    Args:
        aging_rate: anti-starvation aging, in tokens of job length per second of waiting
            (0: off): the key is `length + aging_rate * arrival_time`, so a long job that has
            waited long enough goes ahead of newly arrived short ones (see `PriorityQueue`).

    SJF never preempts a running request for a shorter arrival (`outranks` is False).
    """

    def _key(self, request: Request) -> tuple:
        if request.expected_output_len is not None:
            return 0, self._aged(request.expected_output_len, request), request.arrival_time
        return 1, self._aged(request.num_prompt_tokens, request), request.arrival_time

    def outranks(self, waiting: Request, running: Request) -> bool:
        return False
