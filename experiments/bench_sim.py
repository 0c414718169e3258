"""Benchmark of the simulated executor: simulation speed and fidelity on this machine.

    .venv/bin/python experiments/bench_sim.py                 # both
    .venv/bin/python experiments/bench_sim.py --skip-fidelity --profile   # speed + cProfile
    .venv/bin/python experiments/bench_sim.py --skip-fidelity --num-requests 100000 \
        --instances 8 --rate 320 --no-save-detailed     # a streaming cluster run, peak RSS
    .venv/bin/python experiments/bench_sim.py --skip-fidelity --num-requests 100000 \
        --instances 64 --rate 2560 --no-save-detailed --workers 2   # split over 2 processes

Speed: 10,000 requests of Llama-3-8B on the H100 preset (target: under 30 s of wall time).
Fidelity: calibrate the cost model on the real torch executor (small random model, CPU), then
run held-out workloads through both executors (target: means within 5%, p99 within 10%).
Reports numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

from schedlab.config import EngineConfig
from schedlab.engine import Engine
from schedlab.runs.driver import run_workload
from schedlab.runs.metrics import compute_metrics
from schedlab.runs.workload import build_workload

SPEED_WORKLOAD = {
    "type": "synthetic",
    "input_len": {"dist": "uniform", "min": 64, "max": 1024},
    "output_len": {"dist": "uniform", "min": 32, "max": 512},
    "arrival": {"process": "poisson", "rate": 25.0},
}


def bench_speed(num_requests: int, profile: bool, instances: int = 1, rate: float | None = None,
                save_detailed: bool = True, router: str = "round_robin", workers: int = 1) -> None:
    from schedlab.cluster import Cluster, ClusterConfig

    config = EngineConfig(model="llama3_8b", executor="sim", executor_options={"hardware": "h100"})
    engine = Engine(config)
    target = (engine if instances == 1
              else Cluster(ClusterConfig(num_instances=instances, router=router), config))
    arrival = dict(SPEED_WORKLOAD["arrival"], **({} if rate is None else {"rate": rate}))
    t0 = time.perf_counter()
    work = build_workload(dict(SPEED_WORKLOAD, num_requests=num_requests, arrival=arrival),
                          engine.model_spec.vocab_size, seed=0)
    t_build = time.perf_counter() - t0
    prof = cProfile.Profile() if profile else None
    t0, c0 = time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    run = run_workload(target, work, save_detailed=save_detailed, workers=workers)
    if prof:
        prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    t1 = time.perf_counter()
    m = compute_metrics(run, percentiles=(50, 99))
    t_metrics = time.perf_counter() - t1
    steps = m["num_steps"]  # NOTE: a streaming run keeps no step records, only their totals
    fw = m["mean_framework_time_ms"] * steps / 1000.0
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"== simulation speed: {num_requests} requests at {arrival['rate']} req/s, llama3_8b on "
          f"{instances} x h100 (sim, router {router}), save_detailed={save_detailed}, "
          f"workers={workers} ==")
    print(f"peak RSS {rss:.0f} MB")
    print(f"workload built in {t_build:.2f} s; run in {wall:.2f} s wall "
          f"({'under' if wall < 30 else 'OVER'} the 30 s target), {cpu:.2f} s of CPU time "
          f"(less than wall: other processes share the cores); metrics in {t_metrics:.2f} s")
    print(f"simulated {run.duration_s:.1f} s of serving in {steps} steps "
          f"({steps / wall:.0f} steps/s, {num_requests / wall:.0f} requests/s, "
          f"{run.duration_s / wall:.1f}x real time)")
    print(f"engine schedule+update time {fw:.2f} s ({fw / wall * 100:.0f}% of the run); "
          f"executor (cost model) and driver the rest")
    print(f"completed {m['completed']}, output throughput {m['output_throughput']:.0f} tok/s, "
          f"mean TTFT {m['mean_ttft_ms']:.1f} ms, mean TPOT {m['mean_tpot_ms']:.2f} ms, "
          f"preemptions {m['num_preemptions'] if 'num_preemptions' in m else run.num_preemptions}")
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(15)
        print(s.getvalue())


def bench_fidelity(profile_path: str | None, size: str, threads: int, clock: str) -> None:
    import torch

    from schedlab.calibration.calibrate import calibrate
    from schedlab.calibration.validate import METRICS, validate
    from schedlab.sim.hardware import HardwareProfile
    from schedlab.tiny import build_tiny_model

    torch.set_num_threads(threads)
    model = str(build_tiny_model(size=size))
    print(f"\n== fidelity: llama {size} (random weights), float32 CPU, {threads} thread(s), "
          f"{clock} clock ==")
    if profile_path:
        prof = HardwareProfile.load(profile_path)
    else:
        t0 = time.perf_counter()
        prof = calibrate(model, out=f"outputs/hardware/cpu-calibrated-{clock}.json",
                         clock=clock).profile
        print(f"calibration took {time.perf_counter() - t0:.1f} s\n")
    comps = validate(model, prof, clock=clock)
    worst_mean = max(abs(c.error(k)) for c in comps for k, _ in METRICS if not k.startswith("p"))
    worst_p99 = max(abs(c.error(k)) for c in comps for k, _ in METRICS if k.startswith("p99"))
    print(f"worst mean-metric error {worst_mean * 100:.1f}% (target 5%), "
          f"worst p99 error {worst_p99 * 100:.1f}% (target 10%)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=10_000)
    ap.add_argument("--profile", action="store_true", help="cProfile the simulated run")
    ap.add_argument("--instances", type=int, default=1, help="replicas")
    ap.add_argument("--router", default="round_robin", help="the replicas' router")
    ap.add_argument("--workers", type=int, default=1,
                    help="processes the replicas run in (run_workload's workers)")
    ap.add_argument("--rate", type=float, help="arrivals per second (default 25)")
    ap.add_argument("--no-save-detailed", action="store_true",
                    help="stream (driver.save_detailed=false): no per-request lists")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-fidelity", action="store_true")
    ap.add_argument("--hardware-profile", help="a calibrated profile JSON (default: calibrate)")
    ap.add_argument("--size", default="small", help="tiny-model size for fidelity")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", default="cpu,wall",
                    help="fidelity clocks: cpu (this thread's CPU time, immune to other "
                         "processes) and/or wall")
    args = ap.parse_args()
    if not args.skip_speed:
        bench_speed(args.num_requests, args.profile, args.instances, args.rate,
                    not args.no_save_detailed, args.router, args.workers)
    if not args.skip_fidelity:
        for clock in args.clock.split(","):
            bench_fidelity(args.hardware_profile, args.size, args.threads, clock)


if __name__ == "__main__":
    main()
