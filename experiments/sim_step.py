"""Per-step cost of a simulated engine (Llama-3-8B on H100) with N requests all decoding: the
median wall time of `Engine.step()`, framework and sim executor together, no profiler.

    .venv/bin/python experiments/sim_step.py 28        # the batch of 100k requests at 40 req/s
    .venv/bin/python experiments/sim_step.py 1024 -p   # with a cProfile of the steps

Run it in two trees alternately and compare the medians (one machine, the same minutes).
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time

from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.request import SamplingParams


def main(argv: list[str]) -> None:
    n = int(argv[0]) if argv else 28
    eng = Engine(EngineConfig(model="llama3_8b", executor="sim",
                              executor_options={"hardware": "h100"}, max_num_seqs=max(256, n)))
    for i in range(n):
        eng.add_request([2 + (i + j) % 900 for j in range(64)],
                        SamplingParams(max_tokens=4000, ignore_eos=True))
    sched = eng.scheduler
    while sched.waiting or any(r.num_computed_tokens < r.num_prompt_tokens
                               for r in sched.running):
        eng.step()
    eng.step()
    reps = 300 if n <= 64 else 50
    medians = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            eng.step()
        medians.append((time.perf_counter() - t0) / reps * 1e6)
    assert len(sched.running) == n, "requests ended or were preempted while measured"
    us = statistics.median(medians)
    print(f"n={n} sim Engine.step median {us:.1f} us ({us / n:.2f} us/request)")
    if "-p" in argv:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(1000 if n <= 64 else 50):
            eng.step()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main(sys.argv[1:])
