"""Differential harness for the engine's step path: every built-in scheduler x queue x
allocator x prefix cache x recompute / swap, under load that preempts, on the model-free
executor and on the sim executor; each step's plan (entries, block tables, swap copies,
preemptions), every request's output and timestamps, the step stats (host times left out)
and the counters are written as one JSON document per configuration.

Run it with two trees' interpreters and compare the digests:

    A/.venv/bin/python experiments/step_diff.py /tmp/a.json
    B/.venv/bin/python experiments/step_diff.py /tmp/b.json
    .venv/bin/python experiments/step_diff.py --compare /tmp/a.json /tmp/b.json

(run from the repository root: it imports `tests/fakes.py`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from typing import Any

sys.path.insert(0, "tests")

from fakes import FakeExecutor  # noqa: E402

from schedlab.config import ConfigError, EngineConfig  # noqa: E402
from schedlab.engine import Engine  # noqa: E402
from schedlab.executor import ExecutorOutput  # noqa: E402
from schedlab.kv_allocator import KVAllocator  # noqa: E402
from schedlab.plan import SchedulerOutput  # noqa: E402
from schedlab.plugins.executors.sim import SimExecutor  # noqa: E402
from schedlab.plugins.kv_allocators.paged import PagedKVAllocator  # noqa: E402
from schedlab.request import SamplingParams  # noqa: E402

SCHEDULERS = ("static", "continuous", "chunked_prefill")
QUEUES = ("fcfs", "priority", "sjf", "lpm", "vtc", "edf", "rate_limit")
PREFIX_CACHES = ("none", "hash_block", "radix")
HOST_FIELDS = ("framework_time", "schedule_time", "prepare_time", "forward_time",
               "device_wait_time", "sample_time", "update_time")


class DefaultNextTokens(PagedKVAllocator):
    """Paged, on the ABC's default `allocate_next_tokens`."""

    allocate_next_tokens = KVAllocator.allocate_next_tokens  # type: ignore[assignment]


def _plan_record(plan: SchedulerOutput) -> list[Any]:
    # NOTE: read without building a decode run's entries, so the executor and the update
    # get the plan as the engine made it
    run = plan.decode_run
    head = [] if run is None else [[r.request_id, 1, s, list(t), []]
                                   for r, s, t in zip(*run, strict=True)]
    return [head + [[s.request.request_id, s.num_new_tokens, s.start, list(s.block_ids),
                     [list(p) for p in s.swap_in]] for s in plan.rest],
            [r.request_id for r in plan.preempted], [list(p) for p in plan.swap_out]]


class RecordingFake(FakeExecutor):
    keep_plans = False

    def __init__(self, config: EngineConfig, eos_every: int = 0) -> None:
        super().__init__(config, eos_every=13)
        self.records: list[Any] = []

    def execute(self, plan: SchedulerOutput) -> ExecutorOutput:
        self.records.append(_plan_record(plan))
        return super().execute(plan)


class RecordingSim(SimExecutor):
    def __init__(self, config: EngineConfig, **kw: Any) -> None:
        super().__init__(config, **kw)
        self.records: list[Any] = []

    def execute(self, plan: SchedulerOutput) -> ExecutorOutput:
        self.records.append(_plan_record(plan))
        out = super().execute(plan)
        self.records[-1].append([list(out.sampled_token_ids), out.step_time])
        return out


def _workload(eng: Engine, wave: int, sim: bool) -> None:
    """Requests of one wave: shared prefixes, priorities, deadlines, clients, stop ids."""
    base = [5 + (k * 3) % 50 for k in range(40)]
    for i in range(6):
        k = wave * 6 + i
        plen = 6 + (k * 7) % (60 if sim else 30)
        prompt = (base[: plen // 2] + [7 + (k * 11 + j) % 90 for j in range(plen - plen // 2)])
        sp = SamplingParams(temperature=0.0, max_tokens=3 + (k * 5) % (40 if sim else 20),
                            ignore_eos=(k % 4 == 0),
                            stop_token_ids=[2 + (k * 13) % 997] if k % 5 == 1 else [])
        eng.add_request(prompt, sp, request_id=f"r{k}", arrival_time=0.001 * k,
                        priority=(k * 7) % 3, expected_output_len=sp.max_tokens,
                        client_id=f"c{k % 3}", deadline_ms=(30.0 + 17 * (k % 4)),
                        slo_class=("a", "b")[k % 2])


def run_one(sched: str, queue: str, alloc: str, pc: str, mode: str, sim: bool) -> Any:
    kw: dict[str, Any] = dict(scheduler=sched, queue=queue, prefix_cache=pc,
                              kv_allocator=DefaultNextTokens if alloc == "default" else alloc,
                              preemption_mode=mode, swap_space=4096 * 64 if not sim else "1GiB",
                              max_num_seqs=8, block_size=4)
    if queue == "edf":
        kw["queue_options"] = {"on_miss": "drop"}
    if queue == "rate_limit":
        kw["queue_options"] = {"max_requests": 2, "window_s": 0.01}
    if sched == "chunked_prefill":
        kw["max_num_batched_tokens"] = 24
        kw["long_prefill_threshold"] = 16 if queue in ("fcfs", "sjf") else 0
    if sim:
        kw.update(model="llama3_8b", executor="sim", max_model_len=256, num_kv_blocks=40,
                  block_size=16 if alloc != "contiguous" else 4, max_num_seqs=16,
                  executor_options={"hardware": "a100"})
        if alloc == "contiguous":
            kw["num_kv_blocks"] = 200
        if sched == "chunked_prefill":
            kw["max_num_batched_tokens"] = 64
        if queue == "vtc":
            kw["attention_options"] = {"decode_pad_waste": 0.2}
        cls: Any = RecordingSim
    else:
        kw.update(model="fake", max_model_len=64, num_kv_blocks=24)
        cls = RecordingFake
    try:
        eng = Engine(EngineConfig(**kw), executor_cls=cls)
    except (ConfigError, ValueError) as e:
        return {"error": str(e)}
    steps = 0
    for wave in range(4):
        _workload(eng, wave, sim)
        for _ in range(6):
            if not eng.has_unfinished():
                break
            eng.step()
            eng.check_integrity()
            steps += 1
    while eng.has_unfinished() and steps < 2000:
        eng.step()
        eng.check_integrity()
        steps += 1
    reqs = {}
    for rid, r in eng.requests.items():
        m = r.metrics
        reqs[rid] = [r.output_token_ids, r.status.name, r.finish_reason, r.reject_reason,
                     m.token_times, m.first_scheduled_time, m.first_token_time,
                     m.finished_time, m.num_preemptions, m.num_cached_tokens]
    stats = []
    for st in eng.step_stats:
        d = dataclasses.asdict(st)
        for f in HOST_FIELDS:
            d.pop(f, None)
        stats.append(d)
    return {"plans": eng.executor.records, "requests": reqs, "stats": stats,
            "counters": dataclasses.asdict(eng.counters())}


def configs() -> list[tuple[str, str, str, str, str, bool]]:
    out = []
    for sim in (False, True):
        for sched in SCHEDULERS:
            for queue in QUEUES:
                for alloc in ("paged", "contiguous", "default"):
                    for pc in PREFIX_CACHES:
                        if alloc == "contiguous" and pc != "none":
                            continue
                        for mode in ("recompute", "swap"):
                            out.append((sched, queue, alloc, pc, mode, sim))
    return out


def main() -> None:
    args = sys.argv[1:]
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return
    # NOTE: an option taken for the output path would write the digests to a file named so
    if not (len(args) == 1 and not args[0].startswith("-")
            or len(args) == 3 and args[0] == "--compare"):
        print(f"step_diff.py: expected OUT.json or --compare A.json B.json, got {args}",
              file=sys.stderr)
        sys.exit(2)
    if args[0] == "--compare":
        a, b = (json.load(open(p)) for p in args[1:3])
        bad = [k for k in a if a[k] != b.get(k)]
        print(f"{len(a)} configurations, {len(bad)} differ")
        for k in bad[:20]:
            print("  differs:", k)
        sys.exit(1 if bad or set(a) != set(b) else 0)
    digests = {}
    num_preempted = 0
    for c in configs():
        doc = run_one(*c)
        num_preempted += sum(s["num_preempted"] for s in doc.get("stats", []))
        digests["/".join(map(str, c))] = hashlib.sha256(
            json.dumps(doc, sort_keys=True).encode()).hexdigest()
    json.dump(digests, open(args[0], "w"), indent=0)
    print(f"{len(digests)} configurations, {num_preempted} preemptions in all")


if __name__ == "__main__":
    main()
