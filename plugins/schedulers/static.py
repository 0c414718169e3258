"""Static (request-level) batching, as in FasterTransformer before Orca."""

from __future__ import annotations

from schedlab.scheduler import Scheduler, SchedulerOutput


class StaticScheduler(Scheduler):
    """A batch is admitted together; no request joins until the whole batch has finished.

    When nothing runs, the queue's head requests are admitted as one batch (up to
    `max_num_seqs`, their prompts within the token budget and KV). The batch then decodes
    until every member is done; finished members leave seats empty, as they did in static
    serving systems. A member preempted for KV waits for the next batch.
    """

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        limit = self.config.max_num_batched_tokens
        if self.running:
            budget = self.schedule_running(out, limit)
        else:
            budget = self.admit_waiting(out, limit)
        out.num_batched_tokens = limit - budget
        return out
