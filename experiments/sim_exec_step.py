"""Per-step cost of the simulated executor and the step record alone (no scheduler): the median
wall time of `SimExecutor.execute(plan)` plus `step_stats(...)` on prepared plans of Llama-3-8B
on H100, for a decode-only step of N sequences, a mixed step (one prefill chunk + N decodes)
and a step whose chunk ends mid-prompt (no token sampled for it).

    .venv/bin/python experiments/sim_exec_step.py 26 5     # the batch sizes to time
    valgrind --tool=callgrind .venv/bin/python experiments/sim_exec_step.py 26 --kinds mixed \
        --reps 2000 --rounds 1   # instructions: difference two --reps counts

Run it in two trees alternately and compare the medians (one machine, the same minutes).
"""

from __future__ import annotations

import argparse
import statistics
import time

from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.plan import ScheduledRequest, SchedulerOutput
from schedlab.request import Request, SamplingParams
from schedlab.stats import step_stats


def _plans(n: int, chunk: int) -> dict[str, SchedulerOutput]:
    """A decode-only plan of `n` sequences, the same with a `chunk`-token prefill chunk that
    completes its prompt, and with one that stops halfway through it."""
    params = SamplingParams(max_tokens=4000, ignore_eos=True)
    decodes = []
    for i in range(n):
        r = Request(f"d{i}", [2 + (i + j) % 900 for j in range(64)], params)
        r.output_token_ids.extend([5] * (i % 37 + 1))
        start = len(r.prompt_token_ids) + len(r.output_token_ids) - 1
        decodes.append(ScheduledRequest(r, 1, start, [0]))
    done = Request("p", [3] * (2 * chunk), params)
    half = Request("h", [3] * (3 * chunk), params)
    plans = {
        "decode": SchedulerOutput(list(decodes)),
        "mixed": SchedulerOutput([*decodes, ScheduledRequest(done, chunk, chunk, [0])]),
        "partial": SchedulerOutput([*decodes, ScheduledRequest(half, chunk, chunk, [0])]),
    }
    for p in plans.values():
        p.totals = p.count_totals()
    return plans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sizes", nargs="*", type=int, default=[26, 5])
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--reps", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kinds", default="decode,mixed,partial",
                    help="the plans to time, of decode, mixed, partial")
    args = ap.parse_args()
    eng = Engine(EngineConfig(model="llama3_8b", executor="sim",
                              executor_options={"hardware": "h100"}))
    ex, sched, kv = eng.executor, eng.scheduler, eng.kv
    for n in args.sizes:
        plans = _plans(n, args.chunk)
        for kind in args.kinds.split(","):
            plan = plans[kind]
            totals = plan.totals
            assert totals is not None
            times = []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                for _ in range(args.reps):
                    out = ex.execute(plan)
                    step_stats(1, plan, totals, out, 0.0, 0.0, 0.0, len(sched.running),
                               len(sched.waiting), kv)
                times.append((time.perf_counter() - t0) / args.reps * 1e6)
            us = statistics.median(times)
            print(f"n={n:<4} {kind:<8} execute + step_stats median {us:6.2f} us")


if __name__ == "__main__":
    main()
