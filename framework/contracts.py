"""The rules a scheduler's plan must keep, checked by the engine after every `schedule()`.

`check_plan` is cheap (a pass over the scheduled requests) and runs on every step;
`check_kv_ownership` scans every block table and runs only under `check_integrity()`.
"""

from __future__ import annotations

from schedlab.faults import PluginContractError
from schedlab.kv_manager import KVCacheManager
from schedlab.plan import PlanTotals, ScheduledRequest, SchedulerConfig, SchedulerOutput
from schedlab.request import RequestStatus
from schedlab.scheduler import Scheduler


def check_plan(plan: object, scheduler: str, limits: SchedulerConfig, kv: KVCacheManager,
               step: int) -> PlanTotals:
    """Check one step's plan against the limits and the requests' KV. No state change.

    Args:
        plan: what `schedule()` returned.
        scheduler: the scheduler plugin as messages name it (e.g. `'continuous'`).
        limits: `max_num_seqs` and `max_num_batched_tokens`.
        kv: the KV manager (for the block size).
        step: the step number the plan is for.

    Returns:
        The plan's aggregates (`SchedulerOutput.count_totals`), counted in the same pass.

    Raises:
        PluginContractError: one sentence naming the scheduler and the broken rule.
    """
    if not isinstance(plan, SchedulerOutput):
        raise PluginContractError(
            f"scheduler {scheduler}: schedule() returned {type(plan).__name__}, not a "
            "SchedulerOutput; return an empty SchedulerOutput() when nothing should run")
    num_seqs = plan.num_scheduled
    if num_seqs > limits.max_num_seqs:
        raise PluginContractError(f"{_where(scheduler, step)} {num_seqs} requests, more than "
                                  f"max_num_seqs={limits.max_num_seqs}")
    bs = kv.block_size
    running = RequestStatus.RUNNING
    # NOTE: the hot path: one fused test per request, the message only on a violation; the
    # totals count the rare cases (no int is built per decode) and derive the rest
    num_other = num_other_tokens = num_unsampled = swap_in = first = 0
    run = plan.decode_run
    # NOTE: a Request hashes by identity; a decode run's set is built in one C call
    requests: set[object] = set() if run is None else set(run.requests)
    add = requests.add
    if run is not None:  # NOTE: one token each, no swap-in: only the per-request rules
        for req, start, table in zip(run.requests, run.starts, run.tables, strict=True):
            num_prompt = len(req.prompt_token_ids)
            if (num_prompt + len(req.output_token_ids) - start != 1
                    or start != req.num_computed_tokens or req.status is not running
                    or len(table) * bs <= start):
                _explain_decode(ScheduledRequest(req, 1, start, table), _where(scheduler, step),
                                bs)
            if start < num_prompt:  # a prompt's last token
                num_other += 1
                num_other_tokens += 1
            if req.metrics.first_scheduled_time is None:
                first += 1
    for sr in plan.rest:
        req = sr.request
        add(req)
        start, n = sr.start, sr.num_new_tokens
        num_prompt = len(req.prompt_token_ids)
        left = num_prompt + len(req.output_token_ids) - start  # tokens from start on
        if n == 1 and left == 1:  # NOTE: a decode (or a prompt's last token): ends the sequence
            if (start != req.num_computed_tokens or req.status is not running
                    or len(sr.block_ids) * bs <= start):
                _explain(sr, _where(scheduler, step), bs)
            if start < num_prompt:
                num_other += 1
                num_other_tokens += 1
        else:
            if (n < 1 or start != req.num_computed_tokens or req.status is not running
                    or n > left or len(sr.block_ids) * bs < start + n):
                _explain(sr, _where(scheduler, step), bs)
            if n != 1 or start < num_prompt:  # not a decode
                num_other += 1
                num_other_tokens += n
            if n != left:
                num_unsampled += 1
        if sr.swap_in:
            swap_in += len(sr.swap_in)
        if req.metrics.first_scheduled_time is None:
            first += 1
    num_decode = num_seqs - num_other
    total = num_decode + num_other_tokens
    if len(requests) != num_seqs:
        seen: set[int] = set()
        for sr in plan.scheduled:
            if id(sr.request) in seen:
                raise PluginContractError(
                    f"{_where(scheduler, step)} request {sr.request.request_id!r} twice; a "
                    "request runs at most once per step")
            seen.add(id(sr.request))
    if total > limits.max_num_batched_tokens:
        raise PluginContractError(f"{_where(scheduler, step)} {total} tokens, more than "
                                  f"max_num_batched_tokens={limits.max_num_batched_tokens}")
    return PlanTotals(num_other_tokens, num_decode, num_seqs - num_unsampled, swap_in, first,
                      num_seqs)


def _where(scheduler: str, step: int) -> str:
    """The start of every `check_plan` message (built only for one)."""
    return f"scheduler {scheduler} planned step {step} with"


def _explain_decode(sr: ScheduledRequest, where: str, bs: int) -> None:
    """`_explain` for an entry of a decode run (`SchedulerOutput.add_decodes`), which must
    also be its sequence's last token."""
    req = sr.request
    if sr.start + 1 < req.num_tokens:
        raise PluginContractError(
            f"{where} request {req.request_id!r} in add_decodes() at token {sr.start} of "
            f"{req.num_tokens}; add_decodes() runs a sequence's last token (add() the entry "
            "of any other)")
    _explain(sr, where, bs)


def _explain(sr: ScheduledRequest, where: str, bs: int) -> None:
    """Raise the error for a scheduled request that breaks a rule (see `check_plan`)."""
    req, n, start = sr.request, sr.num_new_tokens, sr.start
    rid = req.request_id
    if n < 1:
        raise PluginContractError(f"{where} {n} tokens for request {rid!r}; a scheduled "
                                  "request runs at least one token")
    if start != req.num_computed_tokens:
        raise PluginContractError(
            f"{where} request {rid!r} starting at token {start}, but it has computed "
            f"{req.num_computed_tokens}; a step continues where the request stopped")
    if start + n > req.num_tokens:
        raise PluginContractError(
            f"{where} tokens [{start}, {start + n}) for request {rid!r}, which has only "
            f"{req.num_tokens} tokens")
    if req.status is not RequestStatus.RUNNING:
        raise PluginContractError(
            f"{where} request {rid!r} whose status is {req.status.name}; admit it first "
            "(admit_waiting() does, or set RUNNING and append it to self.running)")
    raise PluginContractError(
        f"{where} request {rid!r} up to token {start + n} but KV blocks for only "
        f"{len(sr.block_ids) * bs} tokens; allocate first (self.kv.allocate, or "
        "schedule_running / admit_waiting)")


def check_kv_ownership(scheduler: Scheduler, plan: SchedulerOutput | None, name: str) -> None:
    """The full KV check: no block held by two requests unless shared through the prefix cache,
    and the last plan's block tables are the allocator's. Scans every block table.

    Raises:
        PluginContractError: names the scheduler, the block and the requests.
    """
    kv = scheduler.kv
    table = kv.allocator.block_table
    pc = kv.prefix_cache
    owner: dict[int, str] = {}
    for req in scheduler.running:
        for b in table(req):
            other = owner.setdefault(b, req.request_id)
            if other != req.request_id and (pc is None or not pc.is_cached(b)):
                raise PluginContractError(
                    f"scheduler {name}: KV block {b} is held by requests {other!r} and "
                    f"{req.request_id!r} but is not a prefix-cache block")
    if plan is None:
        return
    running = {id(r) for r in scheduler.running}
    for sr in plan.scheduled:
        if id(sr.request) not in running:
            continue  # finished (and freed) in the step
        held = table(sr.request)
        if list(sr.block_ids) != held[: len(sr.block_ids)]:
            raise PluginContractError(
                f"scheduler {name} planned request {sr.request.request_id!r} with block table "
                f"{list(sr.block_ids)[:8]}... which is not the KV it holds; plan through "
                "self.plan_request() (or schedule_running / admit_waiting)")
