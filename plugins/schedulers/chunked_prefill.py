"""Chunked prefill (Sarathi-Serve, vLLM V1): decodes first, prefill chunks fill the rest."""

from __future__ import annotations

from schedlab.scheduler import Scheduler, SchedulerOutput


class ChunkedPrefillScheduler(Scheduler):
    """Every step spends at most `max_num_batched_tokens`, decodes first.

    Each step continues the running requests that decode (one token each), then the running
    requests part-way through their prompt (a chunk each, at most `long_prefill_threshold`
    tokens), then, if nothing was preempted, admits waiting requests with a first chunk while
    `max_num_seqs`, the remaining budget and KV allow. A long prompt is thus split over several
    steps and never stalls the decodes; prefill chunks and decodes share one forward pass.
    """

    chunks_prefill = True

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        # NOTE: a stable sort, so a partial prefill admitted before a decoding request does not
        # take the budget first; within each group the admission order is kept.
        self.running.sort(key=lambda r: r.num_tokens - r.num_computed_tokens > 1)
        budget = self.schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:
            self.admit_waiting(out, budget)
        return out
