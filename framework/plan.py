"""The plan of one step and the limits it is made under: what crosses from the scheduler to
the engine and the executor."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
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
    #: the entries (`SchedulerOutput.num_scheduled`)
    num_seqs: int


class DecodeRun(NamedTuple):
    """A plan's first entries in compact form (`SchedulerOutput.decode_run`): one token each
    for `requests[i]` from `starts[i]` (its last token, so each samples), over the block table
    `tables[i]`; no swap-in. Read-only: the lists belong to the plan and the allocator."""

    requests: list[Request]
    starts: list[int]
    tables: list[list[int]]


class SchedulerOutput:
    """The plan of one step: the only thing the scheduler hands on. The executor runs
    `scheduled` (with their block tables and swap copies); the engine records `preempted`.
    Executors read the plan and the requests in it and change neither.

    Args:
        scheduled: the entries, in order.
        preempted: the requests preempted in this step.
        swap_out: swap preemption: (device block, host slot) pairs to copy out before the step.
        totals: the plan's aggregates (the engine sets them once the plan has passed its checks).

    NOTE: the decodes a step continues are usually most of it and change only by one token a
    step. `add_decodes` keeps a run of them at the head of an empty plan as three lists (a
    `DecodeRun`, as vLLM V1 carries cached requests), not as entries: the engine's checks, the
    sim executor and the update read those lists. `scheduled` builds the entries the first time
    it is read (a plugin, an executor that walks them: the same list as ever), after which the
    plan is a plain list again.
    """

    __slots__ = ("rest", "decode_run", "_exposed", "preempted", "swap_out", "totals")

    def __init__(self, scheduled: list[ScheduledRequest] | None = None,
                 preempted: list[Request] | None = None,
                 swap_out: list[tuple[int, int]] | None = None,
                 totals: PlanTotals | None = None) -> None:
        #: the entries after `decode_run` (all of them when there is none); read-only
        self.rest: list[ScheduledRequest] = [] if scheduled is None else scheduled
        #: the compact head of the plan (None: none, every entry is in `rest`); read-only
        self.decode_run: DecodeRun | None = None
        #: `scheduled` was read: entries are added to that list from now on
        self._exposed = scheduled is not None
        self.preempted: list[Request] = [] if preempted is None else preempted
        #: swap preemption: (device block, host slot) pairs to copy out before the step
        self.swap_out: list[tuple[int, int]] = [] if swap_out is None else swap_out
        #: the plan's aggregates, set by the engine once the plan has passed its checks (None
        #: before): an executor may read them instead of walking `scheduled`
        self.totals: PlanTotals | None = totals

    @property
    def scheduled(self) -> list[ScheduledRequest]:
        """Every entry, in order (a decode run at the head built into entries on first read)."""
        run = self.decode_run
        if run is not None:
            self.decode_run = None
            self.rest[0:0] = map(ScheduledRequest, run.requests, repeat(1), run.starts,
                                 run.tables)
        self._exposed = True
        return self.rest

    @scheduled.setter
    def scheduled(self, entries: list[ScheduledRequest]) -> None:
        self.decode_run = None
        self._exposed = True
        self.rest = entries

    def __copy__(self) -> SchedulerOutput:
        """A plan sharing this one's lists, as a dataclass's shallow copy shares them: the
        decode run is built into entries first (two plans holding one run and one entry list
        would each build it into that list)."""
        return SchedulerOutput(self.scheduled, self.preempted, self.swap_out, self.totals)

    def add(self, entry: ScheduledRequest) -> None:
        """Append one entry (what `scheduled.append` does, without building a decode run's
        entries). Changes state."""
        self.rest.append(entry)

    def add_decodes(self, requests: list[Request], starts: list[int],
                    tables: list[list[int]]) -> None:
        """Append one-token entries for `requests` from `starts` over `tables`, each at its
        sequence's last token with no swap-in (the caller checked; the engine checks again),
        kept as a `DecodeRun` when the plan is still empty. The plan keeps the three lists.
        Changes state.

        Raises:
            ValueError: the three lists are not of one length.
        """
        if not len(requests) == len(starts) == len(tables):
            raise ValueError(f"add_decodes() got {len(requests)} requests, {len(starts)} starts "
                             f"and {len(tables)} block tables; one of each per request")
        if self.decode_run is None and not self.rest and not self._exposed and requests:
            self.decode_run = tuple.__new__(DecodeRun, (requests, starts, tables))  # NOTE: C-level
        else:
            self.rest.extend(map(ScheduledRequest, requests, repeat(1), starts, tables))

    def columns(self) -> tuple[list[Request], list[int], list[int], list[list[int]]]:
        """Each entry's request, start, `num_new_tokens` and block table, as four lists in
        entry order, without building a decode run's entries (an executor that packs a batch
        reads these). New lists; the plan is not changed."""
        rest = self.rest
        reqs = [s.request for s in rest]
        starts = [s.start for s in rest]
        num_new = [s.num_new_tokens for s in rest]
        tables = [s.block_ids for s in rest]
        run = self.decode_run
        if run is None:
            return reqs, starts, num_new, tables
        return (run.requests + reqs, run.starts + starts, [1] * len(run.requests) + num_new,
                run.tables + tables)

    @property
    def num_scheduled(self) -> int:
        """How many requests run: `len(scheduled)`, without building entries."""
        run = self.decode_run
        return len(self.rest) + (len(run.requests) if run is not None else 0)

    def requests(self) -> list[Request]:
        """The scheduled requests, in order, without building entries. No state change."""
        run, rest = self.decode_run, self.rest
        if run is None:
            return [s.request for s in rest]
        return run.requests + [s.request for s in rest] if rest else run.requests.copy()

    @property
    def num_batched_tokens(self) -> int:
        """Tokens in the step: the sum of `num_new_tokens`, derived from the plan."""
        run = self.decode_run
        return (len(run.requests) if run is not None else 0) + sum(
            s.num_new_tokens for s in self.rest)

    @property
    def swap_in(self) -> list[tuple[int, int]]:
        """Swap preemption: (host slot, device block) pairs to copy in before the step."""
        return [p for s in self.rest for p in s.swap_in]

    @property
    def is_empty(self) -> bool:
        return self.decode_run is None and not self.rest

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SchedulerOutput):
            return NotImplemented
        return (self.scheduled, self.preempted, self.swap_out, self.totals) == (
            other.scheduled, other.preempted, other.swap_out, other.totals)

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it was

    def __repr__(self) -> str:
        return (f"SchedulerOutput(scheduled={self.scheduled!r}, preempted={self.preempted!r}, "
                f"swap_out={self.swap_out!r}, totals={self.totals!r})")

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
        return PlanTotals(prefill, decode, sampled, swap_in, first, len(self.scheduled))
