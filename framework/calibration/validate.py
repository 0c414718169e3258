"""`schedlab validate`: how close the simulated executor comes to the real one on this machine.

Held-out workloads (length distributions and arrival rates unlike the calibration grid) run
through two engines built from the same `EngineConfig` except the executor: the real torch
executor on the CPU and `sim` with a calibrated CPU profile. Per metric it prints the
simulated value, the measured value and the error.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from schedlab.sim.hardware import HardwareProfile

#: (metric key, label); latencies in ms, throughput in tok/s
METRICS = (
    ("mean_ttft_ms", "mean TTFT (ms)"), ("p99_ttft_ms", "p99 TTFT (ms)"),
    ("mean_tpot_ms", "mean TPOT (ms)"), ("p99_tpot_ms", "p99 TPOT (ms)"),
    ("mean_itl_ms", "mean ITL (ms)"), ("p99_itl_ms", "p99 ITL (ms)"),
    ("mean_e2el_ms", "mean E2EL (ms)"), ("p99_e2el_ms", "p99 E2EL (ms)"),
    ("output_throughput", "output throughput (tok/s)"),
)

#: held-out workloads: other length distributions and arrival processes than calibration
WORKLOADS: dict[str, dict[str, Any]] = {
    "offline_uniform": {
        "type": "synthetic", "num_requests": 32,
        "input_len": {"dist": "uniform", "min": 40, "max": 360},
        "output_len": {"dist": "uniform", "min": 12, "max": 80},
    },
    "poisson_lognormal": {
        "type": "synthetic", "num_requests": 40,
        "input_len": {"dist": "lognormal", "mean": 160, "sigma": 0.6, "min": 8, "max": 700},
        "output_len": {"dist": "lognormal", "mean": 48, "sigma": 0.5, "min": 4, "max": 160},
        "arrival": {"process": "poisson", "rate": 12.0},
    },
}
#: first-call costs, and one step near the token budget: the real run's first large step
#: would otherwise fault in the allocator's memory (a one-off the simulator does not model)
_WARMUP = {"type": "synthetic", "num_requests": 8, "input_len": 240, "output_len": 4}


@dataclass(frozen=True, slots=True)
class Comparison:
    """One workload's metrics under both executors."""

    workload: str
    simulated: dict[str, float]
    measured: dict[str, float]
    wall_s: dict[str, float]

    def error(self, key: str) -> float:
        m = self.measured[key]
        return (self.simulated[key] - m) / m if m else 0.0


def run_both(model_dir: str, profile: HardwareProfile, workload: dict[str, Any],
             name: str = "workload", seed: int = 0, clock: str = "wall",
             **engine_kw: Any) -> Comparison:
    """Run `workload` with executor=torch and executor=sim (same config otherwise).

    `clock="cpu"` runs the real engine on a `CPUTimeClock` (this thread's CPU time).
    """
    from schedlab.calibration.measure import make_clock
    from schedlab.config import EngineConfig
    from schedlab.engine import Engine
    from schedlab.runs.driver import run_workload
    from schedlab.runs.metrics import compute_metrics
    from schedlab.runs.workload import build_workload

    base = EngineConfig(model=str(model_dir), dtype="float32", device="cpu", seed=seed,
                        **engine_kw)
    results, walls = {}, {}
    for executor in ("torch", "sim"):
        opts = {"hardware": profile} if executor == "sim" else {}
        engine = Engine(replace(base, executor=executor, executor_options=opts),
                        clock=make_clock(clock) if executor == "torch" else None)
        vocab = engine.model_spec.vocab_size
        run_workload(engine, build_workload(_WARMUP, vocab, seed))  # first-call costs
        work = build_workload(workload, vocab, seed)
        t0 = time.perf_counter()
        run = run_workload(engine, work)
        walls[executor] = time.perf_counter() - t0
        m = compute_metrics(run, percentiles=(50, 99))
        results[executor] = {k: float(m[k]) for k, _ in METRICS}
    return Comparison(name, results["sim"], results["torch"], walls)


def format_comparison(c: Comparison) -> str:
    lines = [f"workload {c.workload}  (real run {c.wall_s['torch']:.1f} s wall, simulated in "
             f"{c.wall_s['sim']:.2f} s)",
             f"{'metric':<28}{'simulated':>12}{'measured':>12}{'error %':>10}"]
    for key, label in METRICS:
        lines.append(f"{label:<28}{c.simulated[key]:>12.2f}{c.measured[key]:>12.2f}"
                     f"{c.error(key) * 100:>10.1f}")
    return "\n".join(lines)


def validate(model_dir: str, profile: HardwareProfile, workloads: Sequence[str] | None = None,
             seed: int = 0, verbose: bool = True, clock: str = "wall",
             **engine_kw: Any) -> list[Comparison]:
    out = []
    for name in workloads or list(WORKLOADS):
        if name not in WORKLOADS:
            raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
        c = run_both(model_dir, profile, WORKLOADS[name], name, seed, clock, **engine_kw)
        if verbose:
            print(format_comparison(c), end="\n\n", flush=True)
        out.append(c)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="schedlab validate", description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="checkpoint dir (default: the small random model)")
    ap.add_argument("--size", default="small", help="tiny-model size when --model is not given")
    ap.add_argument("--profile", help="calibrated profile JSON (default: calibrate now)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help=f"comma-separated, from: {', '.join(WORKLOADS)}")
    ap.add_argument("--scheduler", default="continuous", help="the policy both engines run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time the real run by wall clock, or by this thread's CPU time "
                         "(steady on a busy machine; calibrate with the same --clock)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (use the value the profile was calibrated with)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    model = args.model
    if model is None:
        from schedlab.tiny import build_tiny_model

        model = str(build_tiny_model(size=args.size))
    if args.profile:
        profile = HardwareProfile.load(args.profile)
    else:
        from schedlab.calibration.calibrate import calibrate

        print("no --profile: calibrating first")
        profile = calibrate(model, verbose=True, clock=args.clock).profile
        print()
    validate(model, profile, [w for w in args.workloads.split(",") if w], args.seed,
             clock=args.clock, scheduler=args.scheduler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
