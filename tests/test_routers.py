"""Contract tests for every registered router (a third-party one gets them by installing its
entry point): no request is lost across instances, every instance's KV is whole at the end,
and the cluster's and the router's `check_integrity()` hold after every step."""

from __future__ import annotations

import random

import pytest
from fakes import FakeExecutor

from schedlab import registry
from schedlab.cluster import Cluster, ClusterConfig, InstanceLoad, Router
from schedlab.config import EngineConfig
from schedlab.request import Request, RequestStatus, SamplingParams
from schedlab.runs.distributions import WorkloadRequest

ROUTERS = registry.available("router")


def _workload(n: int = 40, seed: int = 0) -> list[WorkloadRequest]:
    """Poisson-ish arrivals, prompts sharing one of three 48-token prefixes, mixed lengths."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(2, 999) for _ in range(48)] for _ in range(3)]
    out, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(2000.0)
        prompt = rng.choice(prefixes) + [rng.randrange(2, 999) for _ in range(rng.randint(1, 80))]
        out.append(WorkloadRequest(prompt, rng.randint(1, 24), arrival_s=t))
    return out


def _cluster(router: str, **cluster) -> Cluster:
    # a small KV pool (20 blocks of 16) so that preemptions happen too
    ec = EngineConfig(model="fake", max_num_seqs=6, num_kv_blocks=20, block_size=16,
                      prefix_cache="hash_block", scheduler="chunked_prefill",
                      max_num_batched_tokens=64)
    return Cluster(ClusterConfig(router=router, **cluster), ec, executor_cls=FakeExecutor)


LAYOUTS = {"replicas": dict(num_instances=3),
           "disaggregated": dict(num_instances=None, prefill_instances=2, decode_instances=2)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ROUTERS)
def test_no_request_lost_and_every_instance_kv_whole(name, layout):
    cl = _cluster(name, **LAYOUTS[layout])
    wl = _workload()
    res = cl.run(wl, check=True)
    reqs = res.run.requests
    assert [r.request_id for r in reqs] == [str(i) for i in range(len(wl))]
    for r, w in zip(reqs, wl, strict=True):
        assert r.status is RequestStatus.FINISHED_LENGTH, (r.request_id, r.status, r.reject_reason)
        assert r.num_output_tokens == w.max_tokens
        assert r.prompt_token_ids == w.prompt_token_ids
    for inst in cl.instances:
        e = inst.engine
        assert not e.has_unfinished() and not inst.pending and not inst.in_flight
        u = e.kv.usage()
        assert u.used_blocks == 0, f"instance {inst.index} still holds {u.used_blocks} blocks"
        assert u.free_blocks + u.cached_blocks == u.num_blocks
        e.check_integrity()
    routed = sum(s.num_routed for s in res.instances)
    assert routed == len(wl)
    if layout == "disaggregated":
        # every request with more than one output token moved to a decode instance once
        moved = sum(1 for w in wl if w.max_tokens > 1)
        assert sum(s.num_transfers_out for s in res.instances) == moved
        assert sum(s.num_transfers_in for s in res.instances) == moved


@pytest.mark.parametrize("name", ROUTERS)
def test_select_returns_an_index_of_the_pool(name):
    router = registry.load("router", name)()
    rng = random.Random(1)
    for n in (1, 2, 5):
        router.bind(n)
        for k in range(30):
            loads = [InstanceLoad(i, rng.randint(0, 4), rng.randint(0, 4), rng.randint(0, 5000),
                                  rng.randint(0, 100), 100, rng.choice([0, 16, 32]))
                     for i in range(n)]
            req = Request(str(k), [2] * rng.randint(1, 64), SamplingParams(max_tokens=4))
            j = router.select(req, loads)
            assert isinstance(j, int) and 0 <= j < n
            router.on_routed(req, j)
            router.check_integrity()
            router.on_finished(req, j)


def test_round_robin_takes_turns():
    cl = _cluster("round_robin", num_instances=3)
    res = cl.run(_workload(30))
    assert [s.num_routed for s in res.instances] == [10, 10, 10]


def _loads(outstanding: list[int], cached: list[int] | None = None) -> list[InstanceLoad]:
    cached = cached or [0] * len(outstanding)
    return [InstanceLoad(i, 1, 0, o, 10, 10, c)
            for i, (o, c) in enumerate(zip(outstanding, cached, strict=True))]


def test_least_loaded_picks_fewest_outstanding_tokens():
    r = registry.load("router", "least_loaded")()
    r.bind(3)
    req = Request("a", [2, 3], SamplingParams())
    assert r.select(req, _loads([500, 20, 300])) == 1


def test_prefix_aware_prefers_the_cache_within_the_load_cap():
    r = registry.load("router", "prefix_aware")(max_load_ratio=2.0, load_slack_tokens=0)
    r.bind(3)
    req = Request("a", [2] * 64, SamplingParams())
    # instance 2 holds the longest prefix and is within 2x of the lightest: chosen
    assert r.select(req, _loads([100, 150, 190], [0, 16, 48])) == 2
    # instance 2 is over the cap: the longest prefix among the rest wins
    assert r.select(req, _loads([100, 150, 250], [0, 16, 48])) == 1
    # no instance has the prefix: the least loaded one
    assert r.select(req, _loads([100, 50, 250])) == 1
    with pytest.raises(ValueError, match="max_load_ratio"):
        registry.load("router", "prefix_aware")(max_load_ratio=0.5)


def test_prefix_aware_keeps_a_shared_prefix_on_one_instance():
    """Two groups of requests with one prefix each, the second request of a group arriving
    after the first has been prefilled: prefix_aware sends the group to the instance that
    cached it, round robin splits it (and recomputes the prefix)."""
    rng = random.Random(3)
    pre = [[rng.randrange(2, 999) for _ in range(64)] for _ in range(2)]
    wl = [WorkloadRequest(pre[i % 2] + [rng.randrange(2, 999) for _ in range(8)], 2,
                          arrival_s=0.05 * i) for i in range(8)]
    hits = {}
    for name in ("round_robin", "prefix_aware"):
        res = _cluster(name, num_instances=3).run(wl, check=True)
        hits[name] = res.run.num_prefix_hit_tokens
    assert hits["prefix_aware"] > hits["round_robin"]


class _Broken(Router):
    def select(self, request, loads):
        return len(loads)  # one past the end


def test_a_router_class_is_accepted_and_a_bad_index_is_named():
    cl = _cluster(_Broken, num_instances=2)
    with pytest.raises(registry.PluginError, match="_Broken.select returned 2"):
        cl.run(_workload(2))


def test_unknown_router_lists_the_installed():
    with pytest.raises(registry.PluginError, match="installed: least_loaded, prefix_aware"):
        _cluster("nope", num_instances=2)


def test_every_builtin_router_has_a_config():
    from pathlib import Path

    from omegaconf import OmegaConf

    conf = Path(__file__).resolve().parents[1] / "conf" / "router"
    for name in ROUTERS:
        cfg = OmegaConf.load(conf / f"{name}.yaml")
        assert cfg.name == name
        registry.load("router", name)(**cfg.options)  # its options are accepted


def test_an_out_of_tree_router_by_dotted_path():
    path = "schedlab.plugins.routers.least_loaded:LeastLoadedRouter"
    res = _cluster(path, num_instances=2).run(_workload(6), check=True)
    assert res.router == path and all(r.is_finished for r in res.run.requests)


def test_contract_workload_preempts():
    """The contract runs are meaningful: the small KV pool forces preemptions."""
    res = _cluster("round_robin", **LAYOUTS["replicas"]).run(_workload())
    assert res.run.num_preemptions > 0
