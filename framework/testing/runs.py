"""Property runs: random workloads through a real `Engine` with one plugin swapped in.

The engine runs on `CheckingExecutor` (no model): every step's plan is checked by the engine,
`check_integrity()` runs after every step, every request must finish with the output the
fake model gives without any scheduling (so preemption and prefix reuse cannot change it),
and the KV pool and host slots must come back whole.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from schedlab import registry
from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.request import RequestStatus, SamplingParams
from schedlab.testing.executor import VOCAB, CheckingExecutor, reference_output

#: the interfaces a run exercises (attention and executor need a model: see contracts);
#: a router runs in a cluster of engines (`run_cluster`)
RUN_KINDS = ("scheduler", "queue", "kv_allocator", "prefix_cache", "router")

BLOCK_SIZE = 4
MAX_MODEL_LEN = 48
#: the checked runs' token budget for a scheduler that chunks prefills (a third of a sequence)
TIGHT_BUDGET = 16


@dataclass(frozen=True, slots=True)
class RunSetting:
    """One engine configuration a plugin runs under; the plugin replaces its own interface's
    entry, the rest are built-ins."""

    name: str
    engine: dict[str, Any] = field(default_factory=dict)


SETTINGS: tuple[RunSetting, ...] = (
    RunSetting("continuous, fcfs, no prefix cache, recompute"),
    RunSetting("chunked_prefill, hash_block, priority, swap", {
        "scheduler": "chunked_prefill", "prefix_cache": "hash_block", "queue": "priority",
        "preemption_mode": "swap", "swap_space": "24KiB", "long_prefill_threshold": 8}),
    RunSetting("static, radix, lpm", {"scheduler": "static", "prefix_cache": "radix",
                                      "queue": "lpm"}),
)


@dataclass(frozen=True, slots=True)
class RunReport:
    """What one checked run did."""

    num_requests: int
    num_steps: int
    num_preemptions: int
    num_prefix_hit_tokens: int


def engine_config(kind: str, spec: str | type, options: dict[str, Any] | None,
                  setting: RunSetting) -> EngineConfig:
    """The engine config of `setting` with the plugin in place of its interface's default."""
    e: dict[str, Any] = dict(setting.engine)
    e[kind] = spec
    if options:
        e[f"{kind}_options"] = dict(options)
    alloc = registry.load("kv_allocator", e.get("kv_allocator", "paged"))
    cache = registry.load("prefix_cache", e.get("prefix_cache", "none"))
    if cache.requires_sharing and not alloc.supports_sharing:
        e["prefix_cache"] = "none"  # the engine refuses the pair; run without a cache
    sched = registry.load("scheduler", e.get("scheduler", "continuous"))
    # NOTE: a budget tight enough to split prompts, where the scheduler may split them
    e.setdefault("max_num_batched_tokens", TIGHT_BUDGET if sched.chunks_prefill else MAX_MODEL_LEN)
    return EngineConfig(model="schedlab-testing", block_size=BLOCK_SIZE,
                        max_model_len=MAX_MODEL_LEN, num_kv_blocks=20, max_num_seqs=6, **e)


def run_cluster(spec: str | type, options: dict[str, Any] | None, seed: int,
                num_instances: int = 3, num_requests: int = 24) -> RunReport:
    """A seeded random workload through a cluster of `num_instances` checked engines behind
    the router (on `CheckingExecutor`, no model): every request must end, each with the
    output it has without scheduling, and every instance's KV pool must come back whole.

    Raises:
        AssertionError, PluginError: the first broken invariant, in one sentence.
    """
    from schedlab.cluster import Cluster
    from schedlab.cluster.config import ClusterConfig
    from schedlab.runs.distributions import WorkloadRequest

    rng = random.Random(seed)
    engine = EngineConfig(model="schedlab-testing", block_size=BLOCK_SIZE,
                          max_model_len=MAX_MODEL_LEN, num_kv_blocks=20, max_num_seqs=4,
                          max_num_batched_tokens=MAX_MODEL_LEN, prefix_cache="hash_block")
    prefixes = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(0, 16))] for _ in range(3)]
    workload = []
    for _ in range(num_requests):
        prompt = (rng.choice(prefixes) + [rng.randrange(1, VOCAB) for _ in
                                         range(rng.randint(1, 12))])[: MAX_MODEL_LEN - 17]
        workload.append(WorkloadRequest(prompt, rng.randint(1, 16),
                                        arrival_s=rng.randint(0, 20) * 1e-3,
                                        priority=rng.randint(0, 2)))
    workload.sort(key=lambda w: w.arrival_s)
    cluster = Cluster(ClusterConfig(num_instances=num_instances, router=spec,
                                    router_options=dict(options or {})), engine,
                      executor_cls=CheckingExecutor)
    result = cluster.run(workload, check=True)
    reqs = result.run.requests
    assert len(reqs) == num_requests, (
        f"{num_requests - len(reqs)} of {num_requests} requests were never routed")
    for r in reqs:
        assert r.is_finished and r.status is not RequestStatus.REJECTED, (
            f"request {r.request_id!r} ended {r.status.name}: {r.reject_reason}")
        want = reference_output(r, MAX_MODEL_LEN)
        assert r.output_token_ids == want, (
            f"request {r.request_id!r} produced {r.output_token_ids}, expected {want}")
    for inst in cluster.instances:
        u = inst.engine.kv.usage()
        assert u.used_blocks == 0, f"instance {inst.index}: {u.used_blocks} KV blocks still used"
    steps = sum(i.engine.counters().num_steps for i in cluster.instances)
    preemptions = sum(i.engine.counters().num_preemptions for i in cluster.instances)
    return RunReport(len(reqs), steps, preemptions, 0)


def run_engine(config: EngineConfig, seed: int, num_requests: int = 16) -> RunReport:
    """Drive a seeded random workload (shared prefixes, staggered arrivals, priorities, a pool
    small enough to preempt) to the end, checking everything on the way.

    Raises:
        AssertionError, PluginContractError: the first broken invariant, in one sentence.
    """
    rng = random.Random(seed)
    eng = Engine(config, executor_cls=CheckingExecutor)
    executor = eng.executor
    assert isinstance(executor, CheckingExecutor)
    executor.bind(eng.kv)
    max_len = eng.max_model_len
    prefixes = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(0, 16))] for _ in range(3)]
    arrivals: dict[int, list[tuple[list[int], SamplingParams, int]]] = {}
    for _ in range(num_requests):
        prompt = (rng.choice(prefixes) + [rng.randrange(1, VOCAB)
                                         for _ in range(rng.randint(1, 12))])[: max_len - 1]
        sp = SamplingParams(max_tokens=rng.randint(1, min(16, max_len - len(prompt))),
                            ignore_eos=rng.random() < 0.7)
        arrivals.setdefault(rng.randint(0, 6), []).append((prompt, sp, rng.randint(0, 2)))
    reqs = []
    max_steps = 50 * num_requests * 16
    for step in range(max_steps):
        for prompt, sp, prio in arrivals.pop(step, []):
            reqs.append(eng.add_request(prompt, sp, priority=prio,
                                        expected_output_len=sp.max_tokens,
                                        client_id=f"c{prio}", deadline_ms=100.0 * (prio + 1)))
        if not arrivals and not eng.has_unfinished():
            break
        eng.step()
        eng.check_integrity()
    else:
        left = sum(not r.is_finished for r in reqs)
        raise AssertionError(f"{left} requests still unfinished after {max_steps} steps: the "
                             "schedule stalls")
    for r in reqs:
        if r.status is RequestStatus.REJECTED:
            raise AssertionError(f"request {r.request_id!r}, which fits the engine, was rejected: "
                                 f"{r.reject_reason}")
        want = reference_output(r, max_len)
        if r.output_token_ids != want:
            raise AssertionError(f"request {r.request_id!r} produced {r.output_token_ids}, "
                                 f"expected {want}: scheduling changed a request's output")
    u = eng.kv.usage()
    assert u.used_blocks == 0 and u.free_blocks + u.cached_blocks == u.num_blocks, (
        f"KV pool not whole after the run: {u.used_blocks} blocks still in use")
    assert eng.kv.num_free_host_blocks() == eng.num_swap_blocks, "host swap slots not returned"
    c = eng.counters()
    return RunReport(len(reqs), c.num_steps, c.num_preemptions, c.num_prefix_hit_tokens)
