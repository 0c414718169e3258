"""Engine bookkeeping a long-running caller (a server) relies on: finished requests can be
forgotten and recorded steps handed over, while step numbers and counters keep counting."""

from __future__ import annotations

import pytest

from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.request import SamplingParams


def _sim() -> Engine:
    return Engine(EngineConfig(model="llama3_8b", executor="sim", num_kv_blocks=256))


def test_forget_drops_only_finished_requests():
    e = _sim()
    a = e.add_request(list(range(2, 50)), SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="not finished"):
        e.forget(a.request_id)
    e.run_until_done(check=True)
    assert e.forget(a.request_id) is a
    assert a.request_id not in e.requests
    with pytest.raises(KeyError):
        e.forget(a.request_id)


def test_drained_step_stats_keep_their_numbering():
    e = _sim()
    e.add_request(list(range(2, 50)), SamplingParams(max_tokens=3))
    e.run_until_done()
    first = e.drain_step_stats()
    assert [s.step for s in first] == [1, 2, 3] and e.step_stats == []
    e.add_request(list(range(2, 50)), SamplingParams(max_tokens=2))
    e.run_until_done()
    assert [s.step for s in e.step_stats] == [4, 5]
    assert e.counters().num_steps == 5


def test_set_clock_before_requests_runs_the_engine_on_it():
    from schedlab.clock import VirtualClock

    e = _sim()
    clock = VirtualClock()
    clock.advance(5.0)  # a clock already at 5 s: the run's times show whose clock ran
    e.set_clock(clock)
    a = e.add_request(list(range(2, 50)), SamplingParams(max_tokens=3))
    e.run_until_done()
    assert e.clock is clock and a.metrics.arrival_time == 5.0 and clock.now() > 5.0
    with pytest.raises(RuntimeError, match="requests were added"):
        e.set_clock(VirtualClock())


def test_the_plan_totals_are_the_plans_own():
    from fakes import FakeExecutor

    class Counting(FakeExecutor):
        def execute(self, plan):
            # NOTE: the engine set the first-scheduled times after its check: compare the rest
            mine = plan.count_totals()._replace(num_first_runs=0)
            self.compared.append(plan.totals._replace(num_first_runs=0) == mine)
            return super().execute(plan)

    Counting.compared = []
    eng = Engine(EngineConfig(model="fake", scheduler="chunked_prefill", max_model_len=64,
                              num_kv_blocks=24, block_size=4, max_num_batched_tokens=16,
                              preemption_mode="swap", swap_space=4096 * 64),
                 executor_cls=Counting)
    for i in range(8):
        eng.add_request(list(range(2 + i, 30)), SamplingParams(max_tokens=12, ignore_eos=True))
    eng.run_until_done(check=True)
    assert Counting.compared and all(Counting.compared)
    assert eng.counters().num_swaps > 0
    assert sum(s.num_decode_tokens for s in eng.step_stats) > 0
