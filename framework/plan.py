"""The plan of one step and the limits it is made under: what crosses from the scheduler to
the engine and the executor."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from schedlab.request import Request


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Limits every scheduler respects, made by the engine from its config (which holds the
    defaults).

    Args:
        max_num_seqs: the most requests running at once.
        max_num_batched_tokens: the most tokens in one step (prefill + decode).
        max_model_len: the longest sequence, prompt plus output.
        long_prefill_threshold: chunk size cap for one prefill in one step (0: the budget).

    Swap vs recompute preemption is not a scheduler setting: it follows the KV manager's host
    pool (`KVCacheManager.num_swap_blocks`, 0 in recompute mode).
    """

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    long_prefill_threshold: int


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step: tokens [start, start + num_new_tokens) run."""

    request: Request
    num_new_tokens: int
    start: int
    block_ids: list[int]
    #: swap preemption: (host slot, device block) pairs bringing the request's KV back
    swap_in: Sequence[tuple[int, int]] = ()

    @property
    def samples(self) -> bool:
        """Whether this step ends with a sampled token for the request (prefill complete)."""
        r = self.request
        return self.start + self.num_new_tokens == len(r.prompt_token_ids) + len(
            r.output_token_ids)


class PlanTotals(NamedTuple):
    """A step's aggregates, counted in one pass over its plan (`SchedulerOutput.totals`)."""

    num_prefill_tokens: int
    #: one new token past the prompt each
    num_decode_tokens: int
    #: entries whose step ends at their sequence's last token (each samples one)
    num_sampled: int
    #: (host slot, device block) pairs of the entries' `swap_in`
    num_swap_in: int
    #: entries whose request runs for the first time (no `first_scheduled_time` yet)
    num_first_runs: int


@dataclass(slots=True)
class SchedulerOutput:
    """The plan of one step: the only thing the scheduler hands on. The executor runs
    `scheduled` (with their block tables and swap copies); the engine records `preempted`.
    Executors read the plan and the requests in it and change neither."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    #: swap preemption: (device block, host slot) pairs to copy out before the step
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    #: the plan's aggregates, set by the engine once the plan has passed its checks (None
    #: before): an executor may read them instead of walking `scheduled`
    totals: PlanTotals | None = None

    @property
    def num_batched_tokens(self) -> int:
        """Tokens in the step: the sum of `num_new_tokens`, derived from the plan."""
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def swap_in(self) -> list[tuple[int, int]]:
        """Swap preemption: (host slot, device block) pairs to copy in before the step."""
        return [p for s in self.scheduled for p in s.swap_in]

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def count_totals(self) -> PlanTotals:
        """The plan's aggregates (what the engine's check sets as `totals`), in one pass."""
        prefill = decode = sampled = swap_in = first = 0
        for s in self.scheduled:
            r = s.request
            n, end = s.num_new_tokens, s.start + s.num_new_tokens
            if n == 1 and s.start >= len(r.prompt_token_ids):
                decode += 1
            else:
                prefill += n
            sampled += end == len(r.prompt_token_ids) + len(r.output_token_ids)
            swap_in += len(s.swap_in)
            first += r.metrics.first_scheduled_time is None
        return PlanTotals(prefill, decode, sampled, swap_in, first)
