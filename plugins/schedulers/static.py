"""Static (request-level) batching, as in FasterTransformer before Orca."""

from __future__ import annotations

from schedlab.scheduler import Scheduler, SchedulerOutput


class StaticScheduler(Scheduler):
    """A batch is admitted together; no request joins until the whole batch has finished.

    When nothing runs, the queue's head requests form one batch (up to `max_num_seqs`, as
    long as KV for their prompts fits). The batch's prompts are prefilled first, as many
    whole prompts per step as the token budget allows, then the batch decodes in lockstep
    until every member is done. Finished members leave their seats empty, as they did in
    static serving systems; a member preempted for KV waits for the next batch.
    """

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        limit = self.config.max_num_batched_tokens
        if not self.running:
            self._form_batch()
        prefilling = [r for r in self.running if len(r.prompt_token_ids)
                      + len(r.output_token_ids) - r.num_computed_tokens > 1]
        if prefilling:
            budget = limit
            for req in prefilling:
                n = req.num_tokens - req.num_computed_tokens
                if n > budget:
                    break
                out.scheduled.append(self.plan_request(req, n))
                budget -= n
        else:
            self.schedule_running(out, limit)
        return out

    def _form_batch(self) -> None:
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            req = self.next_waiting()
            prefix = self.kv.match_prefix(req)
            if not self.kv.can_allocate(req, req.num_tokens, prefix):
                break
            self.admit(req, req.num_tokens, prefix)
