"""A plan's decodes carried as one `DecodeRun` (requests, starts, tables) instead of an entry
each: the same steps, tokens and times as the entries give, and every plugin that reads or
changes `scheduled` sees the entries as before."""

from __future__ import annotations

import copy

import pytest
from fakes import fake_engine

from schedlab.config import EngineConfig
from schedlab.contracts import PluginContractError
from schedlab.engine import Engine
from schedlab.faults import PluginRuntimeError
from schedlab.plan import ScheduledRequest, SchedulerOutput
from schedlab.request import SamplingParams
from schedlab.runs.driver import run_workload
from schedlab.runs.workload import build_workload
from schedlab.scheduler import Scheduler

SIM_H100 = dict(executor="sim", executor_options={"hardware": "h100"})
WORKLOAD = {
    "type": "synthetic",
    "num_requests": 60,
    "input_len": {"dist": "uniform", "min": 16, "max": 400},
    "output_len": {"dist": "uniform", "min": 4, "max": 120},
    "arrival": {"process": "poisson", "rate": 40.0},
}
HOST = ("framework_time", "schedule_time", "prepare_time", "forward_time", "device_wait_time",
        "sample_time", "update_time")


def _run(cfg: dict, walk_entries: bool) -> tuple[list, list, int]:
    """Run the workload; `walk_entries`: the executor reads `plan.scheduled` before it runs
    the step (as the torch executor does), so no step keeps a decode run past the checks."""
    engine = Engine(EngineConfig(model="llama3_8b", **SIM_H100, **cfg))
    execute = engine.executor.execute
    runs = 0

    def wrapped(plan: SchedulerOutput):
        nonlocal runs
        runs += plan.decode_run is not None
        if walk_entries:
            assert len(plan.scheduled) == plan.totals.num_seqs
        return execute(plan)

    engine.executor.execute = wrapped
    work = build_workload(WORKLOAD, engine.model_spec.vocab_size, seed=3)
    result = run_workload(engine, work)
    reqs = [(r.request_id, r.status, r.output_token_ids, r.metrics.token_times,
             r.metrics.first_scheduled_time, r.metrics.num_preemptions) for r in result.requests]
    steps = [{k: v for k, v in vars_of(s).items() if k not in HOST} for s in engine.step_stats]
    return reqs, steps, runs


def vars_of(step) -> dict:
    return {k: getattr(step, k) for k in step.__dataclass_fields__}


@pytest.mark.parametrize("cfg", [
    dict(),
    dict(scheduler="chunked_prefill", max_num_batched_tokens=256),
    dict(num_kv_blocks=120, block_size=16, preemption_mode="swap"),
    dict(num_kv_blocks=120, block_size=16, queue="priority"),
    dict(prefix_cache="hash_block"),
], ids=["continuous", "chunked", "swap", "recompute", "prefix_cache"])
def test_a_decode_run_gives_what_its_entries_give(cfg):
    reqs, steps, runs = _run(cfg, walk_entries=False)
    reqs2, steps2, runs2 = _run(cfg, walk_entries=True)
    assert runs > len(steps) // 2  # most steps reached the executor as a decode run
    assert reqs == reqs2
    assert steps == steps2


class Reversed(Scheduler):
    """Continuous batching, its plan's entries run in reverse order (a legal reorder)."""

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.schedule_running(out, self.config.max_num_batched_tokens)
        self.admit_waiting(out, budget)
        out.scheduled.reverse()
        return out


def test_a_plugin_that_reorders_scheduled_runs_its_order():
    eng = fake_engine(scheduler=Reversed)
    for i in range(3):
        eng.add_request(list(range(2 + i, 10 + i)), SamplingParams(max_tokens=6, ignore_eos=True),
                        request_id=f"r{i}")
    eng.step()  # the prefills
    eng.step()
    order = [sr.request.request_id for sr in eng.executor.plans[-1].scheduled]
    assert order == ["r2", "r1", "r0"]
    eng.run_until_done(check=True)
    assert all(len(r.output_token_ids) == 6 for r in eng.requests.values())


class MidPrompt(Scheduler):
    """Puts a request's first prompt token in `add_decodes`, which is for a last token."""

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.waiting:
            req = self.next_waiting()
            self.admit(req, 1)
            out.add_decodes([req], [0], [self.kv.allocator.block_table(req)])
        return out


def test_add_decodes_of_a_token_that_is_not_the_last_is_refused_with_a_sentence():
    eng = fake_engine(scheduler=MidPrompt)
    eng.add_request(list(range(2, 12)), SamplingParams(max_tokens=2), request_id="r0")
    with pytest.raises(PluginContractError, match=r"request 'r0' in add_decodes\(\) at token 0 "
                       r"of 10; add_decodes\(\) runs a sequence's last token"):
        eng.step()


class DecodeTwice(Scheduler):
    """Runs the prompt whole, then lists its one decode twice in the decode run."""

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.waiting:
            req = self.next_waiting()
            self.admit(req, req.num_tokens)
            out.add(self.plan_request(req, req.num_tokens))
        elif self.running:
            req = self.running[0]
            self.kv.allocate_next_tokens([req])
            table = self.kv.allocator.block_table(req)
            out.add_decodes([req, req], [req.num_computed_tokens] * 2, [table, table])
        return out


def test_a_request_twice_in_a_decode_run_is_refused_with_a_sentence():
    eng = fake_engine(scheduler=DecodeTwice)
    eng.add_request(list(range(2, 12)), SamplingParams(max_tokens=3), request_id="r0")
    eng.step()
    with pytest.raises(PluginContractError, match=r"planned step 2 with request 'r0' twice; a "
                       r"request runs at most once per step"):
        eng.step()


def test_an_executor_that_returns_too_few_tokens_is_told_how_many():
    eng = fake_engine()
    for _ in range(2):
        eng.add_request(list(range(2, 8)), SamplingParams(max_tokens=4, ignore_eos=True))
    eng.step()
    plan = eng.scheduler.schedule()
    with pytest.raises(ValueError, match="1 sampled entries for a plan of 2"):
        eng.scheduler.update_from_output(plan, [5], 0.0)


def _three_decoding() -> tuple[Engine, list, SchedulerOutput]:
    """A model-free engine with three requests past their prompt, and its next plan."""
    eng = fake_engine()
    reqs = [eng.add_request(list(range(2, 8)), SamplingParams(max_tokens=4, ignore_eos=True))
            for _ in range(3)]
    eng.step()
    return eng, reqs, eng.scheduler.schedule()


def test_entries_built_from_a_decode_run_are_the_plan_as_entries():
    eng, reqs, plan = _three_decoding()
    assert plan.decode_run is not None and plan.rest == []
    assert plan.num_scheduled == 3 and plan.requests() == reqs
    entries = plan.scheduled
    assert plan.decode_run is None and plan.rest is entries
    table = eng.kv.allocator.block_table
    assert entries == [ScheduledRequest(r, 1, 6, table(r)) for r in reqs]


def test_a_plans_columns_are_its_entries_read_across():
    eng, reqs, plan = _three_decoding()
    late = eng.add_request(list(range(2, 12)), SamplingParams(max_tokens=2))
    plan.add(ScheduledRequest(late, 10, 0, [90]))  # a prefill after the decode run
    cols = plan.columns()
    assert plan.decode_run is not None  # read without building the run's entries
    entries = plan.scheduled
    assert cols == ([s.request for s in entries], [s.start for s in entries],
                    [s.num_new_tokens for s in entries], [s.block_ids for s in entries])
    assert cols[0] == [*reqs, late] and cols[2] == [1, 1, 1, 10]
    assert plan.columns() == cols  # the same from the entries


def test_a_copied_plan_shares_its_entries_and_builds_them_once():
    _, reqs, plan = _three_decoding()
    twin = copy.copy(plan)
    assert len(twin.scheduled) == len(plan.scheduled) == 3
    assert twin.scheduled is plan.scheduled and [s.request for s in twin.scheduled] == reqs
    deep = copy.deepcopy(_three_decoding()[2])
    assert deep.num_scheduled == len(deep.scheduled) == 3


class ShortStarts(Scheduler):
    """Admits two requests whole, then hands add_decodes() one start for the two."""

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.waiting:
            while self.waiting:
                req = self.next_waiting()
                self.admit(req, req.num_tokens)
                out.add(self.plan_request(req, req.num_tokens))
        elif self.running:
            reqs = self.running[:2]
            tables = self.kv.allocate_next_tokens(reqs)
            out.add_decodes(reqs, [reqs[0].num_computed_tokens], tables)
        return out


def test_add_decodes_of_lists_of_unequal_length_is_refused_with_a_sentence():
    eng = fake_engine(scheduler=ShortStarts)
    for _ in range(2):
        eng.add_request(list(range(2, 12)), SamplingParams(max_tokens=3))
    eng.step()
    with pytest.raises(PluginRuntimeError, match=r"scheduler '\S*ShortStarts' raised ValueError"
                       r"\('add_decodes\(\) got 2 requests, 1 starts and 2 block tables; one of "
                       r"each per request'\) in schedule\(\) at step 2"):
        eng.step()
