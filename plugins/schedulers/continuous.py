"""Continuous (iteration-level) batching, as in Orca and vLLM."""

from __future__ import annotations

from schedlab.scheduler import Scheduler, SchedulerOutput


class ContinuousScheduler(Scheduler):
    """Requests join and leave at every step.

    Each step first continues the running requests (one decode token each, preempting by
    policy when KV runs out), then, if nothing was preempted, admits waiting requests in
    queue order with their whole prompt while `max_num_seqs`, the token budget and KV allow.
    """

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:
            self.admit_waiting(out, budget)
        return out
