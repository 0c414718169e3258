"""Chunked prefill (Sarathi-Serve, vLLM V1): decodes first, prefill chunks fill the rest."""

from __future__ import annotations

from schedlab.request import Request
from schedlab.scheduler import Scheduler, SchedulerOutput


def _prefilling(r: Request) -> bool:
    """Whether a running request is part-way through its prompt (more than one token left)."""
    return len(r.prompt_token_ids) + len(r.output_token_ids) - r.num_computed_tokens > 1


def _decodes_first(running: list[Request]) -> bool:
    """Whether no decoding request sits after a prefilling one. No state change."""
    prefill_seen = False
    for r in running:
        if len(r.prompt_token_ids) + len(r.output_token_ids) - r.num_computed_tokens > 1:
            prefill_seen = True
        elif prefill_seen:
            return False
    return True


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
        # take the budget first; within each group the admission order is kept. Most steps
        # find the order already kept (a finished prefill sits next to the decodes) and skip it.
        if not _decodes_first(self.running):
            self.running.sort(key=_prefilling)
        budget = self.schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:
            self.admit_waiting(out, budget)
        return out
