"""Moving a request between engines (`Engine.migrate_out` / `migrate_in`): the public API the
cluster's prefill/decode disaggregation is built on."""

from __future__ import annotations

import pytest

from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.request import RequestStatus, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPT = list(range(3, 40))


def _engine(model: str, **kw) -> Engine:
    return Engine(EngineConfig(model=model, block_size=4, num_kv_blocks=64, max_model_len=128,
                               **kw))


def test_a_request_migrated_after_its_prefill_continues_token_for_token(llama_dir):
    ref = _engine(llama_dir)
    want = ref.add_request(PROMPT, GREEDY)
    ref.run_until_done(check=True)

    src, dst = _engine(llama_dir), _engine(llama_dir)
    free0 = src.counters().kv_free_blocks
    req = src.add_request(PROMPT, GREEDY, request_id="r")
    while not req.output_token_ids:
        src.step()
    moved = src.migrate_out("r")
    assert moved.num_tokens == len(PROMPT) and moved.data is not None
    assert "r" not in src.requests and not src.has_unfinished()
    assert src.counters().kv_free_blocks == free0  # its KV is freed on the source
    src.check_integrity()
    assert dst.can_migrate_in(moved)
    dst.migrate_in(moved)
    assert req.status is RequestStatus.RUNNING
    dst.run_until_done(check=True)
    assert dst.counters().num_steps >= 11
    assert all(s.num_prefill_tokens == 0 for s in dst.step_stats)  # nothing recomputed
    assert req.output_token_ids == want.output_token_ids


def test_a_queued_request_migrates_without_kv_and_is_computed_there(llama_dir):
    src, dst = _engine(llama_dir), _engine(llama_dir)
    req = src.add_request(PROMPT, GREEDY, request_id="q")  # queued, not yet scheduled
    moved = src.migrate_out("q")
    assert moved.num_tokens == 0 and moved.data is None
    dst.migrate_in(moved)
    dst.run_until_done(check=True)
    assert req.status is RequestStatus.FINISHED_LENGTH and req.num_output_tokens == 12


def test_migration_refuses_finished_requests_and_duplicate_ids():
    src, dst = _engine("llama3_8b", executor="sim"), _engine("llama3_8b", executor="sim")
    done = src.add_request(PROMPT, SamplingParams(max_tokens=1), request_id="d")
    src.run_until_done()
    with pytest.raises(ValueError, match="finished"):
        src.migrate_out(done.request_id)
    src.add_request(PROMPT, GREEDY, request_id="x")
    dst.add_request(PROMPT, GREEDY, request_id="x")
    with pytest.raises(ValueError, match="already in use"):
        dst.migrate_in(src.migrate_out("x"))
