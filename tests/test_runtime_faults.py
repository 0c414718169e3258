"""Plugins that break while running, blamed on the right plugin in one sentence.

The broken plugins live in `tests/fixtures/broken_plugins/` and are named as a user names
them, by dotted path (`queue=lossy_queue:DropEveryThirdQueue`); each test asserts the whole
sentence a user reads.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fakes import FakeExecutor

from schedlab import LLM, SamplingParams
from schedlab.config import ConfigError, EngineConfig
from schedlab.contracts import PluginContractError
from schedlab.engine import Engine
from schedlab.faults import PluginRuntimeError

BROKEN = Path(__file__).parent / "fixtures" / "broken_plugins"


@pytest.fixture(autouse=True)
def _broken_plugins_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(BROKEN))
    monkeypatch.chdir(BROKEN)  # locations in messages are relative to the current directory


def _engine(**kw) -> Engine:
    base = dict(model="fake", block_size=4, max_model_len=64, num_kv_blocks=40, max_num_seqs=4)
    return Engine(EngineConfig(**{**base, **kw}), executor_cls=FakeExecutor)


def _run(engine: Engine, num_requests: int = 6) -> None:
    for i in range(num_requests):
        engine.add_request([5, 6, 7, 8] * 3 + [i], SamplingParams(max_tokens=6))
    engine.run_until_done()


ROWS = {
    "queue drops requests": (
        {"queue": "lossy_queue:DropEveryThirdQueue"},
        "queue 'lossy_queue:DropEveryThirdQueue' lost 2 requests: add() accepted them but "
        "pop()/iteration never returned them (request ids '2', '5')"),
    "queue queues twice": (
        {"queue": "twice_queue:EchoQueue"},
        "queue 'twice_queue:EchoQueue' add() of request '0' grew len() by 2; add() queues a "
        "request once"),
    "pop() keeps the head": (
        {"queue": "twice_queue:StickyHeadQueue"},
        "queue 'twice_queue:StickyHeadQueue' peek() returned request '0', which is RUNNING, "
        "not waiting; a queue holds each waiting request once (did add() or prepend() queue "
        "it twice, or pop() not remove it?)"),
    "pop() is not peek()": (
        {"queue": "twice_queue:NewestPopQueue"},
        "queue 'twice_queue:NewestPopQueue' pop() returned request '5' but peek() had just "
        "returned request '0'; pop() must remove and return the request peek() returns"),
    "peek() returns None": (
        {"queue": "bad_returns:PeekNoneQueue"},
        "queue 'bad_returns:PeekNoneQueue' peek() returned None, not a Request; peek() "
        "returns the head of the queue (the engine calls it only when len() > 0)"),
    "pop() returns None": (
        {"queue": "bad_returns:PopNoneQueue"},
        "queue 'bad_returns:PopNoneQueue' pop() returned None but peek() had just returned "
        "request '0'; pop() must remove and return the request peek() returns"),
    "select_victim() returns None": (
        {"queue": "bad_returns:VictimNoneQueue", "num_kv_blocks": 12},
        "queue 'bad_returns:VictimNoneQueue' select_victim() returned None, not one of the 3 "
        "candidates it was given; return one of them"),
    "expire() returns None": (
        {"queue": "bad_returns:ExpireNoneQueue"},
        "queue 'bad_returns:ExpireNoneQueue' expire() returned None; return a list of "
        "Dropped(request, reason) ([] when nothing expired)"),
    "expire() returns bare requests": (
        {"queue": "bad_returns:ExpireRawQueue"},
        "queue 'bad_returns:ExpireRawQueue' expire() returned the entry request '4'; each "
        "entry is Dropped(request, reason), the reason a non-empty str"),
    "expire() gives a number as the reason": (
        {"queue": "bad_returns:ExpireBadReasonQueue"},
        "queue 'bad_returns:ExpireBadReasonQueue' expire() returned the entry Dropped(request"
        " '4', 5 (int)); each entry is Dropped(request, reason), the reason a non-empty str"),
    "accept() returns an int": (
        {"queue": "bad_returns:AcceptIntQueue"},
        "queue 'bad_returns:AcceptIntQueue' accept() returned 42 (int) for request '0'; "
        "return None to queue it or the reason it is refused (a non-empty str)"),
    "accept() returns no reason": (
        {"queue": "bad_returns:AcceptEmptyQueue"},
        "queue 'bad_returns:AcceptEmptyQueue' accept() returned '' (str) for request '0'; "
        "return None to queue it or the reason it is refused (a non-empty str)"),
    "__len__() returns a str": (
        {"queue": "bad_returns:LenStrQueue"},
        "queue 'bad_returns:LenStrQueue' __len__() of the new, empty queue returned '0' (str); "
        "it returns the number of queued requests, an int (0 here)"),
    "__len__() raises": (
        {"queue": "bad_returns:LenRaisingQueue"},
        "queue 'bad_returns:LenRaisingQueue' raised RuntimeError('len boom') in __len__() "
        "(bad_returns.py:64)"),
    "match claims blocks not held": (
        {"prefix_cache": "lying_caches:PhantomPrefixCache"},
        "prefix_cache 'lying_caches:PhantomPrefixCache' match() returned block 0, which it "
        "does not hold (is_cached() is False); a match names only blocks the cache holds "
        "(inserted and not evicted)"),
    "match claims free blocks": (
        {"prefix_cache": "lying_caches:ClaimsEverythingCache"},
        "prefix_cache 'lying_caches:ClaimsEverythingCache' match() returned block 0, which is "
        "in the allocator's free pool; a match names only blocks the cache holds (inserted "
        "and not evicted)"),
    "match over-reports num_tokens": (
        {"prefix_cache": "lying_caches:OverCountingPrefixCache"},
        "prefix_cache 'lying_caches:OverCountingPrefixCache' match() returned 3 blocks holding "
        "16 tokens for a 13-token sequence; a match is whole blocks of 4 tokens (num_tokens == "
        "len(block_ids) * block_size) within the sequence"),
    "allocate_next_tokens() drops one": (
        {"kv_allocator": "short_allocator:DropsLastAllocator"},
        "kv_allocator 'short_allocator:DropsLastAllocator' allocate_next_tokens() returned 3 "
        "entries for 4 requests; one per request, in order (None where a new block is "
        "needed)"),
    "schedule() raises": (
        {"scheduler": "boom_scheduler:BoomScheduler"},
        "scheduler 'boom_scheduler:BoomScheduler' raised KeyError('oops') in schedule() at "
        "step 5 (boom_scheduler.py:17)"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("row", list(ROWS))
def test_broken_plugin_is_named_in_one_sentence(row):
    plugins, sentence = ROWS[row]
    with pytest.raises(PluginContractError) as e:
        _run(_engine(**plugins))
    assert str(e.value) == sentence


def test_a_raise_is_blamed_on_the_plugin_whose_code_raised():
    """The queue's peek() raising inside the scheduler's admission is the queue's fault."""
    with pytest.raises(PluginRuntimeError) as e:
        _run(_engine(queue="twice_queue:IndexedQueue"))
    assert str(e.value) == ("queue 'twice_queue:IndexedQueue' raised KeyError('head') in peek() "
                            "at step 1 (twice_queue.py:55)")
    assert isinstance(e.value.__cause__, KeyError)  # the full traceback


@pytest.mark.timeout(60)
def test_lost_requests_under_llm_generate():
    """LLM.generate never hands back finish_reason=None: the lost requests are an error."""
    llm = LLM("llama3_8b", executor="sim", queue="lossy_queue:DropEveryThirdQueue")
    with pytest.raises(PluginContractError, match=r"^queue 'lossy_queue:DropEveryThirdQueue' "
                       r"lost 2 requests: add\(\) accepted them"):
        llm.generate([[1, 2, 3, 4, 5] * i for i in range(1, 8)], SamplingParams(max_tokens=4))
    assert all(r.finish_reason is not None for r in llm.engine.requests.values())


@pytest.mark.timeout(120)
def test_lost_requests_under_schedlab_run(tmp_path, capsys):
    """`schedlab run` with the lossy queue: one line, exit 2, within the run (no hang)."""
    from schedlab.cli import main

    rc = main(["run", "executor=sim", "model=llama3_8b", "hardware=h100",
               "queue=lossy_queue:DropEveryThirdQueue", "workload.num_requests=7",
               "workload.arrival.process=offline",
               "driver.progress=false", "print_table=false", "logger=none", "plots=false",
               f"hydra.run.dir={tmp_path}"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err == ("schedlab: error: queue 'lossy_queue:DropEveryThirdQueue' lost 2 requests: "
                   "add() accepted them but pop()/iteration never returned them (request ids "
                   "'2', '5')\n")


@pytest.mark.timeout(180)
def test_scheduler_raising_under_schedlab_run(tmp_path, capsys, monkeypatch):
    """One line naming the scheduler, the method, the step and the line; HYDRA_FULL_ERROR=1
    adds the plugin's own traceback."""
    from schedlab.cli import main

    args = ["run", "executor=sim", "model=llama3_8b", "hardware=h100",
            "scheduler=boom_scheduler:BoomScheduler", "workload.num_requests=7",
            "driver.progress=false", "print_table=false", "logger=none", "plots=false"]
    line = ("schedlab: error: scheduler 'boom_scheduler:BoomScheduler' raised KeyError('oops') "
            "in schedule() at step 5 (boom_scheduler.py:17)\n")
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    assert main([*args, f"hydra.run.dir={tmp_path / 'a'}"]) == 2
    assert capsys.readouterr().err == line
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    assert main([*args, f"hydra.run.dir={tmp_path / 'b'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and err.endswith(line)
    assert 'return self.table["oops"]' in err


def test_routers_as_a_config_group(tmp_path, capsys, monkeypatch):
    """`router=NAME` gets the installed list like every group; `router=module:Class` runs."""
    from schedlab.cli import main

    assert main(["run", "router=fifo"]) == 2
    assert capsys.readouterr().err == (
        "schedlab: error: router='fifo' is not a router config; configs: least_loaded, "
        "prefix_aware, round_robin; installed router plugins: least_loaded, prefix_aware, "
        "round_robin; or a class as router=module:Class\n")
    rc = main(["run", "executor=sim", "model=llama3_8b", "hardware=h100", "cluster=replicas",
               "router=bad_routers:OffByOneRouter", "workload.num_requests=4",
               "driver.progress=false", "print_table=false", "logger=none", "plots=false",
               f"hydra.run.dir={tmp_path}"])
    assert rc == 2
    assert "router OffByOneRouter.select returned 2; it must return an instance index in " \
        "[0, 2)" in capsys.readouterr().err
    run = ["run", "executor=sim", "model=llama3_8b", "hardware=h100", "cluster=replicas",
           "router=fixtures.plugin_examples.shortest_queue:ShortestQueueRouter",
           "workload.num_requests=4", "driver.progress=false", "print_table=false",
           "logger=none", "plots=false", f"hydra.run.dir={tmp_path / 'ok'}"]
    monkeypatch.syspath_prepend(str(BROKEN.parents[1]))
    assert main(run) == 0, capsys.readouterr().err
    assert (tmp_path / "ok" / "results.json").is_file()


@pytest.mark.parametrize("router,sentence", [
    ("bad_routers:OffByOneRouter", "OffByOneRouter.select returned 1 over a pool of 1; it must "
     "return an instance index in [0, 1) every time"),
    ("bad_routers:NoneRouter", "NoneRouter.select returned None over a pool of 1; it must "
     "return an instance index in [0, 1) every time"),
])
def test_router_contract_in_plugins_check(router, sentence, capsys):
    from schedlab.cli import main

    assert main(["plugins", "--check", f"router={router}", "router=round_robin"]) == 1
    out = capsys.readouterr().out
    assert f"router '{router}'\n" in out and f"  FAIL  contract: {sentence}\n" in out
    assert "  ok    cluster runs: 2 runs of 3 instances" in out  # round_robin
    assert "2 plugins checked: 1 passed, 1 failed" in out


@pytest.mark.parametrize("router,sentence", [
    ("bad_routers:RaisingRouter", "router 'bad_routers:RaisingRouter' raised "
     "RuntimeError('route boom') in select() (bad_routers.py:23)"),
    ("bad_routers:RaisingOnFinishedRouter", "router 'bad_routers:RaisingOnFinishedRouter' "
     "raised KeyError('done') in on_finished() (bad_routers.py:31)"),
])
def test_a_router_that_raises_is_named_in_one_line(router, sentence, tmp_path, capsys):
    """A router's exception in a cluster run: one line naming it, its method and line."""
    from schedlab.cli import main

    rc = main(["run", "executor=sim", "model=llama3_8b", "hardware=h100", "cluster=replicas",
               f"router={router}", "workload.num_requests=4", "driver.progress=false",
               "print_table=false", "logger=none", "plots=false", f"hydra.run.dir={tmp_path}"])
    assert rc == 2
    assert capsys.readouterr().err == f"schedlab: error: {sentence}\n"


@pytest.mark.timeout(60)
def test_a_plugin_that_does_not_return_is_named_while_the_run_waits(monkeypatch, capsys):
    """A scheduler that waits in schedule(): after `STALL_WARNING_S` without a step, one line
    names it, the method and the line; the run goes on when it returns, and a run whose plugins
    return says nothing."""
    from schedlab.runs import stall
    from schedlab.runs.distributions import WorkloadRequest
    from schedlab.runs.driver import run_workload

    monkeypatch.setattr(stall, "STALL_WARNING_S", 0.3)
    work = [WorkloadRequest([5, 6, 7, 8] * 3, 6) for _ in range(4)]
    for timeout, then in ((None, "the run waits for it"),
                          (20, "the run is stopped at 20 s (driver.plugin_timeout_s)")):
        run = run_workload(_engine(scheduler="sleepy_scheduler:SleepyScheduler"), work,
                           plugin_timeout_s=timeout)
        assert all(r.finish_reason == "length" for r in run.requests)
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1, err
        assert err[0].startswith("schedlab: warning: scheduler "
                                 "'sleepy_scheduler:SleepyScheduler' has not returned from "
                                 "schedule() in ")
        assert err[0].endswith(f" s (sleepy_scheduler.py:18); {then} (Ctrl-C stops it and "
                               "keeps what ran)")
    run_workload(_engine(), work)
    assert capsys.readouterr().err == ""


@pytest.mark.timeout(60)
def test_a_plugin_call_past_the_plugin_timeout_stops_the_run_naming_it(tmp_path, capsys):
    """A scheduler that loops in schedule() (swallowing every Exception): after
    `plugin_timeout_s` the run stops with one sentence naming the plugin, the method and the
    line, from `run_workload` and the command line alike (exit 2)."""
    import time

    from schedlab.cli import main
    from schedlab.runs.distributions import WorkloadRequest
    from schedlab.runs.driver import run_workload

    work = [WorkloadRequest([5, 6, 7, 8] * 3, 6) for _ in range(4)]
    t0 = time.monotonic()
    with pytest.raises(PluginRuntimeError) as e:
        run_workload(_engine(scheduler="looping_scheduler:LoopingScheduler"), work,
                     plugin_timeout_s=0.5)
    assert time.monotonic() - t0 < 20  # the planted loop runs 30 s
    msg = str(e.value)
    assert msg.startswith("scheduler 'looping_scheduler:LoopingScheduler' did not return from "
                          "schedule() in "), msg
    # NOTE: the line the loop stands at when stopped: its `while` or a line of its body
    src = (BROKEN / "looping_scheduler.py").read_text().splitlines()
    first = next(i for i, ln in enumerate(src, 1) if ln.strip().startswith("while "))
    at = int(re.search(r"\(looping_scheduler\.py:(\d+)\)", msg).group(1))
    assert first <= at <= first + 4, msg
    assert msg.endswith("; the run was stopped (driver.plugin_timeout_s=0.5; null waits)")
    with pytest.raises(ConfigError, match="plugin_timeout_s=0 must be a number of seconds > 0"):
        run_workload(_engine(), work, plugin_timeout_s=0)

    args = ["run", "executor=sim", "model=llama3_8b", "hardware=h100", "logger=none",
            "workload.num_requests=4", "driver.progress=false", "print_table=false",
            "plots=false"]
    rc = main([*args, "scheduler=looping_scheduler:LoopingScheduler",
               "driver.plugin_timeout_s=0.5", f"hydra.run.dir={tmp_path / 'a'}"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("schedlab: error: scheduler 'looping_scheduler:LoopingScheduler' did "
                          "not return from schedule() in "), err
    assert err.endswith("; the run was stopped (driver.plugin_timeout_s=0.5; null waits)\n")
    assert err.count("\n") == 1
    rc = main([*args, "driver.plugin_timeout_s=-1", f"hydra.run.dir={tmp_path / 'b'}"])
    assert rc == 2
    assert "driver.plugin_timeout_s=-1 must be a number of seconds > 0" in capsys.readouterr().err
