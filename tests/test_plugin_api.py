"""The plugin API (issue 14): each failure a new plugin author hit, reproduced, now a clear
error; the example plugins through every entry (dotted path, class, CLI, checks)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import fake_engine

from schedlab import registry
from schedlab.config import ConfigError, EngineConfig
from schedlab.contracts import PluginContractError
from schedlab.engine import Engine
from schedlab.queue import RequestQueue
from schedlab.request import Request, SamplingParams
from schedlab.scheduler import Scheduler, SchedulerOutput

EXAMPLES = Path(__file__).parent / "fixtures" / "plugin_examples"
LPF = "lpf_queue:LongestPromptFirstQueue"
DECODE_FIRST = "decode_first:DecodeFirstScheduler"
LFU = "lfu_cache:LFUPrefixCache"


@pytest.fixture
def examples(monkeypatch):
    """The example plugins importable as `lpf_queue`, `decode_first`, `lfu_cache`."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield
    registry.load.cache_clear()




def _submit(eng: Engine, n: int = 6, prompt_len: int = 20, max_tokens: int = 4) -> list[Request]:
    return [eng.add_request(list(range(2 + i, 2 + i + prompt_len)),
                            SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            for i in range(n)]


# ---- 1. silent wrong results ----------------------------------------------------------------
class GreedyScheduler(Scheduler):
    """Ignores the token budget: admits every waiting request with its whole prompt."""

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self.schedule_running(out, 1 << 30)
        self.admit_waiting(out, 1 << 30)
        return out


def test_a_plan_over_the_token_budget_fails_naming_plugin_and_limit():
    eng = fake_engine(scheduler=GreedyScheduler, max_num_batched_tokens=64)
    _submit(eng, n=6, prompt_len=20)  # 120 prompt tokens at once
    with pytest.raises(PluginContractError) as e:
        eng.step()
    msg = str(e.value)
    assert "test_plugin_api:GreedyScheduler" in msg
    assert "120 tokens, more than max_num_batched_tokens=64" in msg


class SeatHog(Scheduler):
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        while self.waiting:
            req = self.waiting.pop()
            self.kv.allocate(req, req.num_tokens)
            req.status = req.status.RUNNING
            self.running.append(req)
            out.scheduled.append(self.plan_request(req, req.num_tokens))
        return out


def test_a_plan_over_max_num_seqs_fails():
    eng = fake_engine(scheduler=SeatHog, max_num_seqs=2)
    _submit(eng, n=3, prompt_len=4)
    with pytest.raises(PluginContractError, match="3 requests, more than max_num_seqs=2"):
        eng.step()


class Twice(Scheduler):
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self.admit_waiting(out, self.config.max_num_batched_tokens)
        if out.scheduled:
            out.scheduled.append(out.scheduled[0])
        return out


class NoKV(Scheduler):
    """Plans the head request without allocating its KV."""

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.waiting:
            req = self.waiting.pop()
            req.status = req.status.RUNNING
            self.running.append(req)
            out.scheduled.append(self.plan_request(req, req.num_tokens))
        return out


class PastTheEnd(Scheduler):
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self.admit_waiting(out, self.config.max_num_batched_tokens)
        for s in out.scheduled:
            s.num_new_tokens += 5
        return out


@pytest.mark.parametrize("cls,words", [
    (Twice, "twice; a request runs at most once per step"),
    (NoKV, "KV blocks for only 0 tokens"),
    (PastTheEnd, "which has only 20 tokens"),
])
def test_plans_breaking_request_rules_fail_clearly(cls, words):
    eng = fake_engine(scheduler=cls)
    _submit(eng, n=2)
    with pytest.raises(PluginContractError, match=words):
        eng.step()


class Forgetful(Scheduler):
    """Plans with the helpers only; the token count is left to the plan."""

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.schedule_running(out, self.config.max_num_batched_tokens)
        self.admit_waiting(out, budget)
        return out


def test_tokens_per_step_are_derived_from_the_plan():
    eng = fake_engine(scheduler=Forgetful)
    _submit(eng, n=3, prompt_len=10, max_tokens=3)
    eng.run_until_done(check=True)
    tokens = [s.num_scheduled_tokens for s in eng.step_stats]
    assert tokens[0] == 30 and sum(tokens) == 3 * 10 + 3 * 2
    assert eng.executor.plans[0].num_batched_tokens == 30


class Squatter(Forgetful):
    """Plans every request over the first request's blocks once two run."""

    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        if len(out.scheduled) > 1:
            out.scheduled[1].block_ids = out.scheduled[0].block_ids
        return out


class Sharer(Forgetful):
    """Hands a running request another request's KV blocks (not through the prefix cache)."""

    def schedule(self) -> SchedulerOutput:
        alloc = self.kv.allocator
        if self.running and self.waiting:  # the next admission starts on r0's first block
            alloc.share(self.waiting.peek(), alloc.block_table(self.running[0])[:1])
        return super().schedule()


@pytest.mark.parametrize("cls,words", [
    (Squatter, "with block table .* which is not the KV it holds"),
    (Sharer, "is held by requests 'r0' and 'r1' but is not a prefix-cache block"),
])
def test_kv_ownership_is_checked_under_check_integrity(cls, words):
    # one prefill a step
    eng = fake_engine(scheduler=cls, max_model_len=32, max_num_batched_tokens=32)
    for i in range(2):
        eng.add_request(list(range(2 + i, 22 + i)), SamplingParams(max_tokens=4, ignore_eos=True),
                        request_id=f"r{i}")
    with pytest.raises(PluginContractError, match=words):
        eng.run_until_done(check=True)


def test_a_misspelled_plugin_group_key_is_refused():
    from hydra import compose, initialize_config_module
    from omegaconf import open_dict

    from schedlab.cli.settings import build_settings

    with initialize_config_module("schedlab.conf", version_base="1.3"):
        cfg = compose("config", overrides=["paths.output_dir=/tmp/x"])
    with open_dict(cfg):
        cfg.queue.option = {"aging_rate": 1.0}  # `option:` instead of `options:`
    with pytest.raises(ConfigError) as e:
        build_settings(cfg)
    assert str(e.value).startswith("queue.option is not a key of the queue group; accepted: "
                                   "name, options")


# ---- 2. misleading errors -------------------------------------------------------------------
class MissingPeek(RequestQueue):
    def add(self, request): ...
    def pop(self): ...
    def prepend(self, request): ...
    def remove(self, request): ...
    def __len__(self): return 0
    def __iter__(self) -> Iterator[Request]: return iter(())


class NotAQueue:
    def __init__(self) -> None: ...


class NoneScheduler(Scheduler):
    def schedule(self):
        return None


def test_a_missing_abstract_method_is_named():
    with pytest.raises(registry.PluginError) as e:
        fake_engine(queue=MissingPeek)
    assert str(e.value) == ("queue class test_plugin_api:MissingPeek does not implement the "
                            "abstract method peek of RequestQueue")


def test_a_class_outside_the_interface_is_refused_in_one_sentence():
    with pytest.raises(registry.PluginError, match="is not a subclass of schedlab.queue."
                       "RequestQueue; a queue plugin must subclass it"):
        fake_engine(queue=NotAQueue)


def test_schedule_returning_none_is_a_clear_error():
    eng = fake_engine(scheduler=NoneScheduler)
    _submit(eng, n=1)
    with pytest.raises(PluginContractError, match="schedule\\(\\) returned NoneType, not a "
                       "SchedulerOutput"):
        eng.step()


class AgingQueue(RequestQueue):
    def __init__(self, aging: float = 0.0, **options) -> None:
        super().__init__(**options)
        self.aging = aging
        self._q: list[Request] = []

    def add(self, request): self._q.append(request)
    def pop(self): return self._q.pop(0)
    def peek(self): return self._q[0]
    def prepend(self, request): self._q.insert(0, request)
    def remove(self, request): self._q.remove(request)
    def __len__(self): return len(self._q)
    def __iter__(self): return iter(list(self._q))


def test_option_errors_name_the_option_and_the_accepted_ones():
    eng = fake_engine(queue=AgingQueue, queue_options={"aging": 2.0})  # a valid option is accepted
    assert eng.scheduler.waiting.aging == 2.0
    with pytest.raises(ConfigError) as e:
        fake_engine(queue=AgingQueue, queue_options={"agin": 2.0})
    assert "has no option 'agin'" in str(e.value) and "accepted options: aging" in str(e.value)
    with pytest.raises(ConfigError, match="has no option 'aging'.*FCFSQueue takes no options"):
        fake_engine(queue="fcfs", queue_options={"aging": 2.0})
    with pytest.raises(ConfigError, match="accepted options: reserve"):
        fake_engine(kv_allocator="contiguous", kv_allocator_options={"reserv": "request"})


class KwargsScheduler(Forgetful):
    """Reads its own **options (as the sim executor reads hardware overrides)."""

    def __init__(self, config, kv, queue, **options) -> None:
        super().__init__(config, kv, queue)
        self.options = options


def test_a_constructor_reading_its_own_kwargs_takes_any_option():
    eng = fake_engine(scheduler=KwargsScheduler, scheduler_options={"anything": 1})
    assert eng.scheduler.options == {"anything": 1}


def _fake_dist(root: Path, dist: str, group: str, entries: dict[str, str]) -> None:
    info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "\n".join(f"{k} = {v}" for k, v in entries.items())
    (info / "entry_points.txt").write_text(f"[{group}]\n{lines}\n")


@pytest.fixture
def fake_dists(tmp_path, monkeypatch):
    """Two installed distributions that both declare queue `lifo`, and one with a broken queue."""
    (tmp_path / "dup_a.py").write_text("from schedlab.plugins.queues.fcfs import FCFSQueue as Q\n")
    (tmp_path / "dup_b.py").write_text("from schedlab.plugins.queues.fcfs import FCFSQueue as Q\n")
    (tmp_path / "broken_q.py").write_text(
        "from schedlab.queue import RequestQueue\nclass Q(RequestQueue):\n    pass\n")
    _fake_dist(tmp_path, "pkg-a", "schedlab.queues", {"lifo": "dup_a:Q"})
    _fake_dist(tmp_path, "pkg-b", "schedlab.queues", {"lifo": "dup_b:Q"})
    _fake_dist(tmp_path, "pkg-broken", "schedlab.queues", {"broken": "broken_q:Q"})
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.refresh()
    yield
    monkeypatch.undo()
    registry.refresh()


def test_plugins_lists_a_clashing_name_instead_of_crashing(fake_dists, capsys):
    from schedlab.cli import main

    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.strip().startswith("lifo")]
    assert len(lines) == 2 and all("CLASH" in ln for ln in lines)
    assert "pkg-a" in out and "pkg-b" in out
    with pytest.raises(registry.PluginError, match="'lifo' is declared by 2 entry points, "
                       "dup_a:Q \\(pkg-a\\) and dup_b:Q \\(pkg-b\\)"):
        registry.load("queue", "lifo")


def test_load_checks_name_distribution_and_entry_point(fake_dists, capsys):
    with pytest.raises(registry.PluginError) as e:
        registry.load("queue", "broken")
    assert str(e.value) == (
        "queue entry point broken = broken_q:Q of distribution pkg-broken does not implement "
        "the abstract methods __iter__, __len__, add, peek, pop, prepend, remove of RequestQueue")
    from schedlab.cli import main

    assert main(["plugins", "--check", "queue=broken", "queue=fcfs"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  load: queue entry point broken = broken_q:Q of distribution pkg-broken" in out
    assert "2 plugins checked: 1 passed, 1 failed" in out


# ---- 4. hooks ---------------------------------------------------------------------------------
def test_admission_caps_new_requests_per_step(examples):
    eng = fake_engine(scheduler=DECODE_FIRST, scheduler_options={"max_new_prefills": 2})
    _submit(eng, n=7, prompt_len=6, max_tokens=5)
    eng.run_until_done(check=True)
    new_per_step = [sum(s.start == 0 for s in p.scheduled) for p in eng.executor.plans]
    assert max(new_per_step) == 2 and sum(new_per_step) == 7
    assert new_per_step[:4] == [2, 2, 2, 1]


class CountingCache(registry.load("prefix_cache", "hash_block")):
    matches = acquires = 0

    def match(self, token_ids):
        type(self).matches += 1
        return super().match(token_ids)

    def acquire(self, block_ids):
        type(self).acquires += 1
        super().acquire(block_ids)


def test_prefix_reuse_is_counted_once_per_admission_not_per_lookup():
    eng = fake_engine(queue="lpm", prefix_cache=CountingCache, max_num_seqs=2)
    shared = list(range(100, 132))
    reqs = [eng.add_request(shared + [i + 2], SamplingParams(max_tokens=3, ignore_eos=True))
            for i in range(8)]
    eng.run_until_done(check=True)
    hits = sum(r.metrics.num_cached_tokens > 0 for r in reqs)
    assert hits >= 6 and eng.scheduler.num_preemptions == 0
    assert CountingCache.acquires == hits
    assert CountingCache.matches > 3 * CountingCache.acquires  # lpm looks up all the time


# ---- 5. dotted paths and classes --------------------------------------------------------------
def test_every_plugin_field_takes_a_dotted_path_or_a_class(examples):
    from lfu_cache import LFUPrefixCache

    eng = fake_engine(scheduler=DECODE_FIRST, queue=LPF, prefix_cache=LFUPrefixCache)
    _submit(eng, n=5)
    eng.run_until_done(check=True)
    assert type(eng.kv.prefix_cache) is LFUPrefixCache
    with pytest.raises(registry.PluginError, match="module 'no_such_module' failed to import"):
        fake_engine(queue="no_such_module:Q")
    with pytest.raises(registry.PluginError, match="has no attribute 'Nope'"):
        fake_engine(queue="lpf_queue:Nope")
    with pytest.raises(ConfigError, match="a 'module:Class' path or a class"):
        EngineConfig(model="fake", queue=3)


def test_llm_takes_plugin_classes(examples, llama_dir):
    from decode_first import DecodeFirstScheduler
    from lfu_cache import LFUPrefixCache
    from lpf_queue import LongestPromptFirstQueue

    from schedlab.llm import LLM

    prompts = [[5, 6, 7, 8] * k for k in (1, 3, 2)]
    sp = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.0)
    plain = LLM(llama_dir, max_model_len=64, block_size=4).generate(prompts, sp)
    llm = LLM(llama_dir, max_model_len=64, block_size=4, scheduler=DecodeFirstScheduler,
              scheduler_options={"max_new_prefills": 1}, queue=LongestPromptFirstQueue,
              prefix_cache=LFUPrefixCache)
    out = llm.generate(prompts, sp)
    assert [o.outputs[0].token_ids for o in out] == [o.outputs[0].token_ids for o in plain]


# ---- 6. the checks ship with the package ------------------------------------------------------
@pytest.mark.parametrize("target", [f"queue={LPF}", f"scheduler={DECODE_FIRST}",
                                    f"prefix_cache={LFU}"])
def test_the_examples_pass_plugins_check(examples, target, capsys):
    from schedlab.cli import main

    assert main(["plugins", "--check", target]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "1 plugin checked: 1 passed, 0 failed" in out
    assert "ok    engine runs:" in out


class LeakyCache(registry.load("prefix_cache", "hash_block")):
    """Forgets what it cached but still says it holds blocks: reuse goes wrong."""

    def match(self, token_ids):
        m = super().match(token_ids)
        return type(m)(list(reversed(m.block_ids)), m.num_tokens)


def test_check_plugin_catches_a_cache_that_returns_wrong_blocks():
    from schedlab.testing import check_plugin

    results = check_plugin("prefix_cache", LeakyCache)
    assert results[-1].ok is False
    assert results[-1].check in ("contract", "engine runs")


def test_plugins_check_refuses_a_malformed_target(capsys):
    from schedlab.cli import main

    assert main(["plugins", "--check", "scheduler"]) == 2
    assert "is not KIND=NAME" in capsys.readouterr().err
    assert main(["plugins", "--check", "router2=x"]) == 2


def test_pytest_pyargs_runs_the_checks_against_a_named_plugin(tmp_path):
    import subprocess

    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs",
         "schedlab.testing", "--plugin", f"queue={LPF}", "-k", "check_plugin or contract"],
        cwd=EXAMPLES, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 passed" in p.stdout, p.stdout


# ---- 5 and 7 from the command line ------------------------------------------------------------
def test_cli_runs_dotted_path_plugins_and_writes_steps_csv(tmp_path, monkeypatch, capsys):
    import csv
    import json

    from schedlab.cli import main

    monkeypatch.chdir(EXAMPLES)  # a user's modules next to where they run schedlab
    monkeypatch.setenv("SCHEDLAB_CACHE", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    rc = main(["run", f"scheduler={DECODE_FIRST}", "scheduler.options.max_new_prefills=1",
               f"queue={LPF}", f"prefix_cache={LFU}", "workload.num_requests=4",
               "workload.input_len.max=16", "workload.output_len.min=2",
               "workload.output_len.max=4", "driver.progress=false", "print_table=false",
               "plots=false", "logger=none", f"hydra.run.dir={run_dir}"])
    assert rc == 0, capsys.readouterr().err
    results = json.loads((run_dir / "results.json").read_text())
    assert results["completed"] == 4
    assert results["config"]["scheduler"] == {"name": DECODE_FIRST,
                                              "options": {"max_new_prefills": 1}}
    with open(run_dir / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and [int(r["step"]) for r in rows] == list(range(1, len(rows) + 1))
    assert sum(int(r["num_scheduled_tokens"]) for r in rows) > 0
    assert max(int(r["num_scheduled_seqs"]) for r in rows[:1]) == 1  # one new prefill a step


def test_serve_takes_dotted_path_plugins_as_run_does(monkeypatch, capsys):
    from schedlab.cli import main

    monkeypatch.chdir(EXAMPLES)
    rc = main(["serve", f"scheduler={DECODE_FIRST}", "executor=sim", "--cfg", "job"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert f"name: {DECODE_FIRST}" in captured.out
