"""Multi-turn sessions: building them, ShareGPT conversations, and the driver's release rule."""

from __future__ import annotations

import json

import pytest
from fakes import FakeExecutor

from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.request import RequestStatus
from schedlab.runs.distributions import WorkloadError
from schedlab.runs.driver import run_workload
from schedlab.runs.sessions import next_turns, session_requests
from schedlab.runs.workload import build_workload

SESSIONS = {"type": "sessions", "num_sessions": 4, "turns": 3, "input_len": 6,
            "output_len": 4, "think_time_s": 0.5,
            "arrival": {"process": "poisson", "rate": 10.0}}


def fake_engine(**kw) -> Engine:
    opts = dict(max_num_seqs=8, max_model_len=256, num_kv_blocks=128, block_size=4)
    opts.update(kw)
    return Engine(EngineConfig(model="fake", **opts), executor_cls=FakeExecutor)


def test_sessions_spec_builds_ordered_turns_with_one_start_per_session():
    w = build_workload(SESSIONS, 100, seed=0)
    assert len(w) == 12
    by_session: dict[str, list] = {}
    for r in w:
        by_session.setdefault(r.session_id, []).append(r)
    assert len(by_session) == 4
    for turns in by_session.values():
        assert [r.turn for r in turns] == [0, 1, 2]
        assert len({r.arrival_s for r in turns}) == 1
        assert [r.think_time_s for r in turns] == [0.0, 0.5, 0.5]
    assert len(next_turns(w)) == 8
    assert build_workload(SESSIONS, 100, seed=0) == w


def test_next_turn_arrives_after_the_answer_plus_think_time_with_the_history():
    eng = fake_engine()
    work = session_requests("s", [([5, 6, 7], 3, 0.0), ([8, 9], 2, 0.25), ([10], 2, 1.0)])
    run = run_workload(eng, work)
    a, b, c = run.requests
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in run.requests)
    assert b.metrics.arrival_time == pytest.approx(a.metrics.finished_time + 0.25)
    assert c.metrics.arrival_time == pytest.approx(b.metrics.finished_time + 1.0)
    assert b.prompt_token_ids == [5, 6, 7, *a.output_token_ids, 8, 9]
    assert c.prompt_token_ids == [*b.prompt_token_ids, *b.output_token_ids, 10]
    # the first turn is released at its arrival time, not held by anything
    assert a.metrics.arrival_time == pytest.approx(run.start_time)


def test_sessions_exercise_the_prefix_cache():
    eng = fake_engine(prefix_cache="hash_block")
    work = build_workload({**SESSIONS, "input_len": 8, "output_len": 8}, 100, seed=1)
    run = run_workload(eng, work)
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in run.requests)
    assert run.prefix_hit_rate > 0.3


def test_a_rejected_turn_still_releases_the_next_one():
    eng = fake_engine(max_model_len=16)
    # turn 1 (10 + 3 history + 4 new + 3 out) does not fit max_model_len 16
    work = session_requests("s", [([2] * 10, 3, 0.0), ([3] * 4, 3, 0.1), ([4], 1, 0.1)])
    run = run_workload(eng, work)
    assert [r.status for r in run.requests][:2] == [RequestStatus.FINISHED_LENGTH,
                                                    RequestStatus.REJECTED]
    assert len(run.requests) == 3 and all(r.is_finished for r in run.requests)


def test_sharegpt_conversations_replayed_as_sessions(tmp_path):
    conv = [{"id": "c1", "conversations": [
        {"from": "human", "value": "hello there how are you"},
        {"from": "gpt", "value": "fine thanks and you"},
        {"from": "human", "value": "tell me a story"},
        {"from": "gpt", "value": "once upon a time there was a cat"},
        {"from": "human", "value": "unanswered"}]},
        {"id": "c2", "conversations": [{"from": "human", "value": "hi"},
                                        {"from": "gpt", "value": "hello"}]}]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(conv))
    spec = {"type": "trace", "format": "sharegpt", "path": str(path), "sessions": True,
            "think_time_s": 2.0}
    w = build_workload(spec, 1000, seed=0)
    assert [(r.session_id.split("#")[0], r.turn) for r in w] == [("c1", 0), ("c1", 1),
                                                                 ("c2", 0)]
    assert w[1].think_time_s == 2.0 and w[0].think_time_s == 0.0
    assert w[1].max_tokens == 9  # "once upon a time there was a cat" in stand-in tokens
    eng = fake_engine()
    run = run_workload(eng, w)
    assert run.requests[1].prompt_token_ids[: len(w[0].prompt_token_ids)] == \
        w[0].prompt_token_ids
    with pytest.raises(WorkloadError, match="sharegpt"):
        build_workload({**spec, "format": "jsonl"}, 1000, seed=0)


def test_num_requests_caps_the_turns_session_by_session():
    w = build_workload({**SESSIONS, "num_requests": 5}, 100, seed=0)
    assert [(r.session_id, r.turn) for r in w] == [("s0", 0), ("s0", 1), ("s0", 2), ("s1", 0),
                                                  ("s1", 1)]
