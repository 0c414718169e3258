"""The victim of a KV shortage is the lowest-ranked running request (vLLM V1's
`test_priority_scheduling_preemption`): 5 blocks of 16 tokens, chunked prefill + priority."""

from __future__ import annotations

import pytest
from fakes import FakeExecutor

from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.request import RequestStatus, SamplingParams


@pytest.mark.parametrize("scheduler", ["chunked_prefill", "continuous"])
def test_high_priority_request_short_of_kv_preempts_the_low_one_once(scheduler):
    eng = Engine(EngineConfig(model="fake", scheduler=scheduler, queue="priority",
                              block_size=16, num_kv_blocks=5, max_num_seqs=3,
                              max_num_batched_tokens=200, max_model_len=80),
                 executor_cls=FakeExecutor)
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    lo = eng.add_request(list(range(1, 33)), sp, request_id="lo1", priority=5)
    eng.step()  # lo1: 32 prompt tokens in 2 blocks, then its first token
    hi = eng.add_request(list(range(101, 133)), sp, request_id="hi1", priority=0)
    eng.step()  # lo1 takes its 3rd block, hi1 is admitted with 2: the pool is full
    assert lo.status is hi.status is RequestStatus.RUNNING
    assert eng.kv.allocator.num_free_blocks() == 0
    eng.step()  # hi1 needs a 3rd block: lo1, planned already, is the victim
    assert lo.status is RequestStatus.PREEMPTED and hi.status is RequestStatus.RUNNING
    assert [sr.request.request_id for sr in eng.last_plan.scheduled] == ["hi1"]
    eng.run_until_done(check=True)
    assert eng.counters().num_preemptions == 1  # vLLM: one; before, hi1 preempted itself too
    assert hi.metrics.finished_time < lo.metrics.finished_time
    assert len(lo.output_token_ids) == len(hi.output_token_ids) == 12
