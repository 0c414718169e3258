"""The engine: builds the plugins from a config and runs schedule -> execute -> update.

Building and sizing live in `schedlab.engine_setup`, the checks on a new request in
`schedlab.intake` and the step records in `schedlab.stats`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import NoReturn

from schedlab import registry
from schedlab.clock import Clock
from schedlab.config import EngineConfig
from schedlab.contracts import check_kv_ownership, check_plan
from schedlab.engine_plugins import resolve_plugins
from schedlab.engine_setup import num_kv_blocks, num_swap_blocks, scheduler_limits
from schedlab.executor import Executor
from schedlab.faults import PluginFault, PluginSlot, blame, check_accounted, named
from schedlab.intake import read_prompt, why_bad_metadata, why_invalid
from schedlab.kv_manager import KVCacheManager
from schedlab.request import MigratedRequest, Request, RequestStatus, SamplingParams
from schedlab.scheduler import Scheduler, SchedulerOutput
from schedlab.stats import EngineCounters, StepStats, engine_counters, step_stats


class Engine:
    """One model, one scheduler composed with an allocator, a prefix cache and a queue.

    Args:
        config: the engine config; plugins are looked up by name in the registry.
        executor_cls: an executor class to use instead of the registered `config.executor`
            (a model-free fake in tests and micro-benchmarks); built the same way.
        clock: the clock to run on instead of the executor's own (e.g. a CPU-time clock for
            calibration); request and step times are read from it.

    Raises:
        ConfigError: a value is out of range, or a combination of plugins cannot work.
        registry.PluginError: an unknown plugin name (the message lists the installed ones).
    """

    def __init__(self, config: EngineConfig, executor_cls: type[Executor] | None = None,
                 clock: Clock | None = None) -> None:
        self.config = cfg = config
        plugins = resolve_plugins(cfg, executor_cls)  # every load / option error comes first
        self.scheduler_name = plugins.scheduler.label
        self.executor: Executor = registry.build(plugins.executor, cfg)
        self.model_spec = self.executor.model_spec
        #: the model spec whose EOS ids `_eos` holds (every request shares the one frozenset)
        self._eos_of: object = None
        self._eos: frozenset[int] = frozenset()
        #: the limits the scheduler plans under (`self.scheduler.config`): stored here only
        self.limits = limits = scheduler_limits(cfg, plugins.scheduler.cls, self.model_spec,
                                                self.scheduler_name)
        max_len = limits.max_model_len

        self.kv_spec = self.executor.kv_cache_spec(cfg.block_size)
        self.num_kv_blocks = num_kv_blocks(cfg, self.kv_spec, self.executor, max_len)
        self.executor.initialize_cache(self.num_kv_blocks, cfg.block_size)
        allocator = registry.build(plugins.kv_allocator, self.num_kv_blocks, cfg.block_size,
                                   max_len)
        prefix_cache = registry.build(plugins.prefix_cache, cfg.block_size)
        queue = registry.build(plugins.queue)
        self.num_swap_blocks = num_swap_blocks(cfg, self.kv_spec)
        self.kv = KVCacheManager(allocator, prefix_cache, self.num_swap_blocks)
        self.scheduler: Scheduler = registry.build(plugins.scheduler, limits, self.kv, queue)
        #: the plugins whose calls the engine guards, and their names in messages
        self._slots = [
            PluginSlot("scheduler", self.scheduler, self.scheduler_name),
            PluginSlot("queue", queue, plugins.queue.label),
            PluginSlot("prefix_cache", prefix_cache, plugins.prefix_cache.label),
            PluginSlot("kv_allocator", allocator, plugins.kv_allocator.label),
        ]
        self._check_empty_queue(queue)
        #: requests handed to the scheduler that have not ended (checked after every step)
        self._live: dict[str, Request] = {}
        #: the last step's plan (checked in full by `check_integrity`)
        self.last_plan: SchedulerOutput | None = None
        self.clock: Clock = self.executor.clock
        if clock is not None:
            self.set_clock(clock)
        self.requests: dict[str, Request] = {}
        #: the recorded steps (a long-running caller takes them with `drain_step_stats`)
        self.step_stats: list[StepStats] = []
        self._num_steps = 0
        self._ids = itertools.count()

    def _check_empty_queue(self, queue: object) -> None:
        """The new queue's `len()`, which the engine counts requests by, is an int and 0.

        Raises:
            PluginContractError: one sentence naming the queue (a raise, or another answer).
        """
        try:
            n = queue.__len__()  # type: ignore[attr-defined]  # NOTE: len() hides the type
            if type(n) is not int or n != 0:
                raise PluginFault("queue", (
                    f"__len__() of the new, empty queue returned {named(n)}; it returns the "
                    "number of queued requests, an int (0 here)"))
        except Exception as e:
            raise blame(e, self._slots, self._slots[1], "__len__", None) from e

    @property
    def plugin_slots(self) -> list[PluginSlot]:
        """The plugins whose calls the engine guards, with their names in messages."""
        return list(self._slots)

    @property
    def num_steps(self) -> int:
        """The steps run so far."""
        return self._num_steps

    @property
    def max_model_len(self) -> int:
        """The longest sequence, prompt plus output (`limits.max_model_len`)."""
        return self.limits.max_model_len

    @property
    def max_num_batched_tokens(self) -> int:
        """The token budget of one step (`limits.max_num_batched_tokens`)."""
        return self.limits.max_num_batched_tokens

    # ---- requests ------------------------------------------------------------------------
    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        expected_output_len: int | None = None,
        client_id: str | None = None,
        deadline_ms: float | None = None,
        slo_class: str | None = None,
    ) -> Request:
        """Submit a request. A request that can never run comes back REJECTED with a reason.

        Args:
            prompt_token_ids: the prompt.
            sampling_params: how to sample (default `SamplingParams()`).
            request_id: a unique id (default: a counter).
            arrival_time: on the engine clock (default: now).
            priority: lower runs first under a priority-aware queue.
            expected_output_len: an output-length hint for length-aware policies.
            client_id: the tenant, for fairness policies and per-client metrics.
            deadline_ms: latency objective after arrival, for deadline-aware policies.
            slo_class: a named SLO tier, for per-class metrics.

        Returns:
            The request (queued, or rejected with `reject_reason` set).

        Raises:
            ValueError: `request_id` is in use, or a metadata value is not of its kind (one
                sentence naming it: `schedlab.intake.why_bad_metadata`).
        """
        bad = why_bad_metadata(priority, expected_output_len, client_id, deadline_ms, slo_class)
        if bad is not None:
            raise ValueError(f"add_request: {bad}")
        sp = sampling_params or SamplingParams()
        if request_id is not None:
            rid = request_id
            if rid in self.requests:
                raise ValueError(f"request_id {rid!r} is already in use")
        else:  # NOTE: past ids a caller chose (an LLM's, then a run_workload on its engine)
            rid = str(next(self._ids))
            while rid in self.requests:
                rid = str(next(self._ids))
        now = self.clock.now()
        spec = self.model_spec
        if spec is not self._eos_of:  # NOTE: one frozenset shared by its requests
            self._eos_of, self._eos = spec, frozenset(spec.eos_token_ids)
        ids, reason = read_prompt(prompt_token_ids, spec.vocab_size)
        req = Request(
            request_id=rid,
            prompt_token_ids=ids,
            sampling_params=sp,
            arrival_time=now if arrival_time is None else arrival_time,
            priority=priority,
            expected_output_len=expected_output_len,
            client_id=client_id,
            deadline_ms=deadline_ms,
            slo_class=slo_class,
            eos_token_ids=self._eos,
        )
        self.requests[rid] = req
        if reason is None:
            reason = why_invalid(req, self.limits.max_model_len, self.kv.allocator)
        if reason is not None:
            req.end(RequestStatus.REJECTED, now, reason)
            return req
        try:
            self.scheduler.add_request(req)
        except Exception as e:
            self._raise(e, "add_request", None)
        if not req.is_finished:
            self._live[rid] = req
        return req

    def abort(self, request_id: str) -> None:
        req = self.requests[request_id]
        if not req.is_finished:
            try:
                self.scheduler.abort(req, self.clock.now())
            except Exception as e:
                self._raise(e, "abort", None)
            self._live.pop(request_id, None)

    def set_clock(self, clock: Clock) -> None:
        """Run on `clock` instead of the executor's own, as the `clock` argument does, for an
        engine built before its caller knew which clock it needs. Before any request only.
        Changes state.

        Raises:
            RuntimeError: requests were already added.
        """
        if getattr(self, "requests", None):
            raise RuntimeError("Engine.set_clock: requests were added on the old clock")
        self.executor.set_clock(clock)
        self.clock = self.executor.clock

    def forget(self, request_id: str) -> Request:
        """Drop a finished request from `requests` (a long-running server keeps none).
        Changes state.

        Raises:
            KeyError: no such request. ValueError: it has not finished.
        """
        req = self.requests[request_id]
        if not req.is_finished:
            raise ValueError(f"request {request_id!r} has not finished; abort it first")
        return self.requests.pop(request_id)

    def drain_step_stats(self) -> list[StepStats]:
        """Hand over the steps recorded so far and stop holding them (step numbers and
        `counters().num_steps` keep counting). Changes state."""
        taken, self.step_stats = self.step_stats, []
        return taken

    # ---- migration between engines ---------------------------------------------------------
    def migrate_out(self, request_id: str) -> MigratedRequest:
        """Take an unfinished request off this engine with its computed K/V, for another
        engine to `migrate_in` (prefill/decode disaggregation). Changes state.

        Raises:
            KeyError: no such request here.
            ValueError: the request has finished.
        """
        req = self.requests[request_id]
        if req.is_finished:
            raise ValueError(f"request {request_id!r} has finished; nothing to migrate")
        alloc = self.kv.allocator
        blocks = list(alloc.block_table(req)[: alloc.blocks_for(req.num_computed_tokens)])
        data = self.executor.export_kv(blocks) if blocks else None
        moved = self.scheduler.release(req)
        del self.requests[request_id]
        self._live.pop(request_id, None)
        return MigratedRequest(req, moved, data)

    def can_migrate_in(self, migrated: MigratedRequest) -> bool:
        """Whether this engine has a seat and KV for a migrated request now. No state change."""
        return self.scheduler.can_adopt(migrated.request, migrated.num_tokens)

    def migrate_in(self, migrated: MigratedRequest) -> None:
        """Continue a request migrated from another engine here: its K/V is written into
        blocks allocated for it, nothing is recomputed. Call `can_migrate_in` first.
        Changes state.

        Raises:
            ValueError: a request with its id is already here.
        """
        req = migrated.request
        if req.request_id in self.requests:
            raise ValueError(f"request_id {req.request_id!r} is already in use here")
        blocks = self.scheduler.adopt(req, migrated.num_tokens)
        if migrated.data is not None:
            self.executor.import_kv(blocks, migrated.data)
        self.requests[req.request_id] = req
        self._live[req.request_id] = req

    def has_unfinished(self) -> bool:
        """Whether a request handed to the scheduler has not ended: running, queued, or lost
        by a broken queue (the next `step` then raises, naming it). No state change."""
        if self.scheduler.has_unfinished():
            return True
        return any(not r.is_finished for r in self._live.values())

    # ---- the loop ------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """Run one step: schedule, execute, update.

        Returns:
            The requests that received a token in this step (finished ones included).

        Raises:
            PluginContractError: a plugin broke a rule (the plan's limits, the queue's or the
                prefix cache's contract, a request lost), or raised (`PluginRuntimeError`,
                the original as its cause); one sentence naming the plugin.
        """
        t0 = time.perf_counter()
        step = self._num_steps + 1
        sched = self.scheduler
        try:
            plan = sched.schedule()
        except Exception as e:
            self._raise(e, "schedule", step)
        # NOTE: one pass over the plan (limits, tokens, KV held); ownership in check_integrity
        totals = check_plan(plan, self.scheduler_name, self.limits, self.kv, step)
        plan.totals = totals
        self.last_plan = plan
        if plan.is_empty:
            self._unstick()
            self._check_accounted()
            return []
        if totals.num_first_runs:
            now = self.clock.now()
            for r in plan.requests():
                m = r.metrics
                if m.first_scheduled_time is None:
                    m.first_scheduled_time = now
        t_sched = time.perf_counter() - t0
        # NOTE: not guarded: an executor's errors (device lost, out of memory) are the
        # environment's, and callers catch them by their own types
        result = self.executor.execute(plan)
        t1 = time.perf_counter()
        now = self.clock.now()
        sampled = result.sampled_token_ids
        try:
            finished = sched.update_from_output(plan, sampled, now)
        except Exception as e:
            self._raise(e, "update_from_output", step)
        live = self._live
        for r in finished:
            live.pop(r.request_id, None)
        t_update = time.perf_counter() - t1
        # NOTE: `_record` and `_check_accounted` inline (every step)
        num_running, num_waiting = len(sched.running), len(sched.waiting)
        self.step_stats.append(step_stats(step, plan, totals, result, now, t_sched, t_update,
                                          num_running, num_waiting, self.kv))
        self._num_steps = step
        if num_running + num_waiting != len(live):
            self._check_accounted()
        if None not in sampled:  # NOTE: the common step: every request got a token
            return plan.requests()
        return [r for r, tok in zip(plan.requests(), sampled, strict=True) if tok is not None]

    def _raise(self, exc: Exception, method: str, step: int | None) -> NoReturn:
        """Raise the one-sentence error for what a plugin call raised (`schedlab.faults`),
        the original as its cause."""
        err = blame(exc, self._slots, self._slots[0], method, step)
        if err is exc:
            raise exc
        raise err from exc

    def _check_accounted(self) -> None:
        """No request lost: those handed to the scheduler and not ended are all running or
        queued (a count per step; the scan only when the counts disagree)."""
        sched = self.scheduler
        if len(sched.running) + len(sched.waiting) != len(self._live):
            check_accounted(self._live, sched.running, sched.waiting, self._slots[1].name,
                            self.scheduler_name)

    def _unstick(self) -> None:
        # NOTE: with validated requests an empty plan means nothing is queued; should a policy
        # ever stall with work left, its head request is rejected rather than left waiting.
        try:
            req = self.scheduler.reject_stalled(
                f"scheduler {self.scheduler_name} could not schedule it with the KV pool and "
                "token budget it has", self.clock.now())
        except Exception as e:
            self._raise(e, "reject_stalled", self._num_steps + 1)
        if req is not None:
            self._live.pop(req.request_id, None)

    def counters(self) -> EngineCounters:
        """Cumulative counters and the current load, for drivers, servers and reports. No
        state change."""
        return engine_counters(self._num_steps, self.scheduler, self.kv)

    def run_until_done(self, check: bool = False) -> None:
        """Step until every submitted request has finished. `check` runs `check_integrity()`
        after every step (tests)."""
        while self.has_unfinished():
            self.step()
            if check:
                self.check_integrity()

    def check_integrity(self) -> None:
        """Raise if the scheduler, queue and KV disagree (AssertionError), or a KV block is held
        by two requests outside the prefix cache (PluginContractError). Scans everything."""
        self.scheduler.check_integrity()
        check_kv_ownership(self.scheduler, self.last_plan, self.scheduler_name)
