"""`schedlab calibrate`: time the real executor over a grid of step shapes, fit the cost model.

The real `TorchExecutor` runs a model (by default a small random-weight one, float32 on the
CPU with the sdpa backend; `--device cuda --dtype bfloat16 --attention triton --hardware h200`
on a GPU) over prefill chunks, decode batches and context lengths; the median time of each
shape is fitted by least squares (the efficiency factors and the overheads of
`HardwareProfile`), and the profile is written as JSON for `executor=sim` (`hardware=<path>`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from schedlab.config import DEFAULT_BLOCK_SIZE
from schedlab.executor import Clock
from schedlab.sim.costfit import PARAMS, FitResult, fit_profile
from schedlab.sim.costmodel import StepShape, decode_pad_waste
from schedlab.sim.hardware import PRESETS, HardwareProfile, probe_cpu

#: (query lengths, cached tokens before them), one entry per sequence
Shape = tuple[tuple[int, ...], tuple[int, ...]]


class CPUTimeClock(Clock):
    """Engine time that runs only while this thread computes; waits for arrivals jump.

    With torch on one thread every forward runs on the calling thread, so this clock measures
    the real executor without the time other processes take from a shared machine.
    """

    def __init__(self) -> None:
        self._t0 = time.thread_time()
        self._skipped = 0.0

    def now(self) -> float:
        return time.thread_time() - self._t0 + self._skipped

    def sleep_until(self, t: float) -> None:
        dt = t - self.now()
        if dt > 0:
            self._skipped += dt


#: how a measurement reads time: "wall" (what a user sees) or "cpu" (this thread's CPU time)
TIMERS = {"wall": time.perf_counter, "cpu": time.thread_time}


def make_clock(clock: str) -> Clock | None:
    """The clock a real engine runs on for a measurement: `Engine(config, clock=...)`.

    "wall": None (the executor's own wall clock); "cpu": a `CPUTimeClock`.
    """
    if clock == "cpu":
        return CPUTimeClock()
    if clock != "wall":
        raise ValueError(f"clock={clock!r}; accepted: wall, cpu")
    return None


def default_grid(max_len: int = 1024) -> list[Shape]:
    """Prefill chunks (fresh and after context), decode batches over contexts, mixed steps."""
    grid: list[Shape] = []
    for n in (8, 32, 128, 256, 512):
        grid.append(((n,), (0,)))
    for n, ctx in ((64, 256), (128, 512), (256, 512)):
        grid.append(((n,), (ctx,)))
    grid.append(((64, 64, 64, 64), (0, 0, 0, 0)))
    grid.append(((256,) * 4, (0,) * 4))
    grid.append(((512, 384, 256, 128, 64, 32), (0,) * 6))
    grid.append(((512,) * 4, (0,) * 4))
    grid.append(((160,) * 12, (0,) * 12))
    grid.append(((1,) * 24 + (200,) * 6, (300,) * 24 + (0,) * 6))
    for b in (1, 4, 16, 48):
        for ctx in (64, 256, 768):
            grid.append(((1,) * b, (ctx,) * b))
    grid.append(((1,) * 16 + (128,), (256,) * 16 + (0,)))
    grid.append(((1,) * 8 + (64, 64), (128,) * 8 + (0, 256)))
    # decodes of unequal contexts (padded attention) and a full step of prefills of unequal
    # lengths next to decodes, as continuous batching produces them
    grid.append(((1,) * 24, tuple(range(32, 752, 30))))
    grid.append(((1,) * 16 + (400, 320, 260, 200, 160, 120, 90, 60, 40),
                 tuple(range(100, 420, 20)) + (0,) * 9))
    return [(q, s) for q, s in grid if max(a + b for a, b in zip(q, s, strict=True)) <= max_len]


#: the devices a profile can describe (`HardwareProfile.device`)
DEVICES = ("cpu", "cuda")


def check_setup(device: str = "cpu", dtype: str = "float32", attention: str = "sdpa",
                clock: str = "wall", hardware: str | None = None) -> str:
    """Check that a calibration with these settings can run here, before anything is built.

    Returns:
        The device type, "cpu" or "cuda".

    Raises:
        ValueError: one sentence naming the accepted values: an unknown device, clock, dtype,
            attention backend or base preset; `device="cuda"` where torch sees no CUDA
            device; the `cpu` clock on a GPU (a thread's CPU time misses the GPU's work); a
            backend that cannot run on the device; `hardware` on the CPU (whose peaks are
            measured) or none on a GPU.
    """
    import torch

    from schedlab import registry
    from schedlab.model import resolve_dtype

    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        kind = None
    if kind not in DEVICES:
        raise ValueError(f"device={device!r}; accepted: cpu, cuda (or cuda:N)")
    if clock not in TIMERS:
        raise ValueError(f"clock={clock!r}; accepted: {', '.join(TIMERS)}")
    if kind == "cuda" and clock == "cpu":
        raise ValueError("clock='cpu' counts this thread's CPU time, which misses the GPU's "
                         "work: use clock='wall' on a CUDA device")
    _base_preset(kind, hardware)
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was asked for but torch sees no CUDA device here; "
                         "calibrate on the GPU machine, or use device=cpu")
    resolve_dtype(dtype)
    cls = registry.load("attention", attention)  # PluginError (a ValueError) lists them
    try:
        cls.check_available(torch.device(device))
    except RuntimeError as e:
        raise ValueError(str(e)) from None
    return kind


def _base_preset(kind: str, hardware: str | None) -> HardwareProfile | None:
    """The GPU preset named by `hardware` (None on the CPU); ValueError when it does not fit."""
    key = None if hardware is None else str(hardware).lower().replace("-", "").replace("_", "")
    if kind == "cpu":
        if key not in (None, "cpu"):
            raise ValueError(f"hardware={hardware!r} names a GPU's base preset; on device=cpu "
                             "the base is this CPU, measured: leave hardware unset (or cpu)")
        return None
    if key is None:
        raise ValueError(f"device={kind} needs a base preset for its peaks (hardware); "
                         f"accepted: {', '.join(PRESETS)}")
    if key not in PRESETS:
        raise ValueError(f"unknown hardware preset {hardware!r} for device={kind}; accepted: "
                         f"{', '.join(PRESETS)}")
    return PRESETS[key]


def base_profile(device: str = "cpu", hardware: str | None = None, dtype: str = "float32",
                 attention: str = "sdpa", label: str = "model") -> HardwareProfile:
    """The profile a fit starts from: peaks, efficiency factors at 1, overheads at 0.

    On the CPU the peaks are measured (`probe_cpu()`); on a GPU they are the datasheet figures
    of the preset `hardware` (`a100`, `h100`, `h200`; dense bf16 FLOP/s, so at float32 the
    fitted efficiencies come out far below 1). `dtype` becomes the profile's dtype (the
    simulator's default element size), and `padded_decode_attention` follows what the backend
    `attention` declares (`decode_pad_waste`; None, as triton: each decode reads its own
    context).
    """
    import torch

    from schedlab.model import resolve_dtype

    kind = torch.device(device).type
    preset = _base_preset(kind, hardware)
    if preset is None:
        base = replace(probe_cpu(), name=f"cpu-calibrated-{label}")
    else:
        base = replace(preset, name=f"{preset.name}-calibrated-{label}", device="cuda",
                       linear_efficiency=1.0, attention_efficiency=1.0,
                       memory_efficiency=1.0, kv_efficiency=1.0, interconnect_efficiency=1.0,
                       step_overhead=0.0, seq_overhead=0.0, prefill_overhead=0.0)
    name = str(resolve_dtype(dtype)).removeprefix("torch.")
    return replace(base, dtype=name,
                   padded_decode_attention=decode_pad_waste(attention) is not None)


def shape_of(entry: Shape, attention: str = "sdpa") -> StepShape:
    """A grid entry's shape, its decodes padded as the backend `attention` declares."""
    return StepShape.from_lens(entry[0], entry[1], pad_waste=decode_pad_waste(attention))


def _engine_config(model_dir: str, device: str, dtype: str, attention: str,
                   enforce_eager: bool, max_model_len: int | None, **kw):
    """The engine config a measurement builds its executor or engine from."""
    from schedlab.config import EngineConfig

    return EngineConfig(model=str(model_dir), dtype=dtype, device=device, attention=attention,
                        enforce_eager=enforce_eager, max_model_len=max_model_len, **kw)


def measure_torch(model_dir: str, grid: Sequence[Shape], repeats: int = 5,
                  block_size: int = DEFAULT_BLOCK_SIZE, clock: str = "wall", warm_s: float = 0.02,
                  max_warm: int = 10, device: str = "cpu", dtype: str = "float32",
                  attention: str = "sdpa", enforce_eager: bool = False,
                  max_model_len: int | None = None,
                  executor_options: dict | None = None) -> list[float]:
    """Median time of `TorchExecutor.execute` for each grid entry.

    The executor is built as an engine with `device`, `dtype`, `attention`, `enforce_eager`
    and `max_model_len` would build it: on a CUDA device (unless `enforce_eager`) decode-only
    steps replay CUDA graphs, as they do when served. `execute` synchronises the device
    before it returns, so the wall timer holds the GPU's work. `executor_options` go to the
    executor (`emulate_cuda_graphs=True`: the graphs' padded path on a CPU, a test).

    Each timed run follows about `warm_s` seconds (at most `max_warm` runs) of untimed runs
    of the same shape, so a small step is not timed in the wake of a large one.
    """
    import torch

    from schedlab import registry
    from schedlab.plan import ScheduledRequest, SchedulerOutput
    from schedlab.request import Request, SamplingParams

    cfg = _engine_config(model_dir, device, dtype, attention, enforce_eager, max_model_len,
                         block_size=block_size)
    ex = registry.load("executor", "torch")(cfg, **(executor_options or {}))
    need = max(sum(-(-(q + s) // block_size) for q, s in zip(*e, strict=True)) for e in grid)
    # NOTE: the cache is allocated zero-filled (uninitialised memory may hold denormals,
    # which are slow on CPUs)
    ex.initialize_cache(need + 1, block_size)
    sp = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    gen = torch.Generator().manual_seed(0)
    vocab = ex.model_spec.vocab_size
    plans = []
    for qs, ss in grid:
        plan = SchedulerOutput()
        block = 0
        for i, (q, s) in enumerate(zip(qs, ss, strict=True)):
            toks = torch.randint(0, vocab, (q + s,), generator=gen).tolist()
            req = Request(f"c{i}", toks, sp)
            nb = -(-(q + s) // block_size)
            plan.scheduled.append(ScheduledRequest(req, q, s, list(range(block, block + nb))))
            block += nb
        plan.num_batched_tokens = sum(qs)
        plans.append(plan)
    timer = TIMERS[clock]
    warm = []
    for plan in plans:
        ex.execute(plan)  # first-call costs
        t0 = timer()
        ex.execute(plan)
        warm.append(min(max_warm, round(warm_s / max(timer() - t0, 1e-6))))
    # NOTE: repeats sweep the whole grid in turn, so a burst of load from other processes
    # spreads over shapes instead of spoiling every repeat of one. A step right after a much
    # larger one runs slower (caches hold the other step's activations), while in a served run
    # a step mostly follows steps like it; so each timing follows untimed runs of its shape
    # (about `warm_s` of them; none for a step that long itself).
    runs: list[list[float]] = [[] for _ in plans]
    for _ in range(repeats):
        for plan, out, n in zip(plans, runs, warm, strict=True):
            for _ in range(n):
                ex.execute(plan)
            t0 = timer()
            ex.execute(plan)
            out.append(timer() - t0)
    return [statistics.median(r) for r in runs]


def measure_host_overhead(model_dir: str, num_requests: int = 24, seed: int = 0,
                          clock: str = "wall", device: str = "cpu", dtype: str = "float32",
                          attention: str = "sdpa", enforce_eager: bool = False,
                          max_model_len: int | None = None) -> tuple[float, float]:
    """Host time between forward passes in a real engine run (schedule, update, driver).

    Runs an offline workload through `Engine` + the driver with the torch executor (built
    from `device`, `dtype`, `attention`, `enforce_eager`, `max_model_len`) and fits
    gap = a + b x (sequences in the step) by least squares. Returns (a, b) in seconds.
    """
    import torch

    from schedlab import registry
    from schedlab.engine import Engine
    from schedlab.runs.driver import run_workload
    from schedlab.runs.workload import build_workload

    timer, durations = TIMERS[clock], []
    base = registry.load("executor", "torch")

    class TimedExecutor(base):  # the forward passes, timed by this measurement's timer
        def execute(self, plan):
            t0 = timer()
            out = super().execute(plan)
            durations.append(timer() - t0)
            return out

    # NOTE: a GPU's pool would otherwise take most of the card for a few short requests
    kv = None if torch.device(device).type == "cpu" else "1GiB"
    cfg = _engine_config(model_dir, device, dtype, attention, enforce_eager, max_model_len,
                         kv_cache_memory=kv)
    engine = Engine(cfg, executor_cls=TimedExecutor, clock=make_clock(clock))
    spec = {"type": "synthetic", "num_requests": num_requests,
            "input_len": {"dist": "uniform", "min": 8, "max": 64},
            "output_len": {"dist": "uniform", "min": 8, "max": 48}}
    work = build_workload(spec, engine.model_spec.vocab_size, seed)
    run = run_workload(engine, work)
    st = run.step_stats
    gaps = [b.time - a.time - d for a, b, d in zip(st[:-1], st[1:], durations[1:], strict=True)]
    seqs = [b.num_scheduled_seqs for b in st[1:]]
    a = np.column_stack([np.ones(len(seqs)), seqs])
    coef = np.linalg.lstsq(a, np.asarray(gaps), rcond=None)[0]
    return max(float(coef[0]), 0.0), max(float(coef[1]), 0.0)


def calibrate(model_dir: str, out: str | Path | None = None, repeats: int = 5,
              grid: Sequence[Shape] | None = None, verbose: bool = True,
              host_overhead: bool = True, clock: str = "wall",
              block_size: int = DEFAULT_BLOCK_SIZE, device: str = "cpu",
              dtype: str = "float32", attention: str = "sdpa", hardware: str | None = None,
              enforce_eager: bool = False, max_model_len: int | None = None) -> FitResult:
    """Measure, fit and (if `out`) save a profile of `model_dir` served on `device`.

    The defaults calibrate this CPU: float32, the sdpa backend, peaks from `probe_cpu()`.
    On a GPU the base is a datasheet preset (`hardware`, see `base_profile`) and decode-only
    steps replay CUDA graphs unless `enforce_eager`, as when served: the fit calibrates what
    really runs. NOTE: decode steps (graph replays) and mixed or prefill steps (eager) share
    one fitted `step_overhead` / `seq_overhead`, a known simplification: where a run's steps
    are mostly of one kind the fit leans to it. sdpa's captured decodes pad to context
    buckets, more than the `decode_pad_waste` the fit and the simulator charge.

    Args:
        model_dir: the checkpoint to run (its config also gives the simulator's shapes).
        out: where to write the profile JSON (None: not written).
        repeats: timed runs per grid shape (the median is fitted).
        grid: step shapes; default `default_grid` up to `max_model_len` (else the model's
            longest context).
        verbose: print the measurements, the fit and its error per shape.
        host_overhead: add the engine's and driver's time between steps, measured on a short
            real run, to the fitted overheads (the simulated clock has no other source of it).
        clock: "wall", or "cpu" for this thread's CPU time (see `CPUTimeClock`; CPU only).
        block_size: KV block size in tokens.
        device: "cpu" or "cuda" (`cuda:N`).
        dtype: weights and KV cache dtype; its byte size is the fit's element size.
        attention: the attention backend the executor runs; its `decode_pad_waste` sets how
            decode K/V reads are counted.
        hardware: the base preset on a GPU (`a100`, `h100`, `h200`); unset on the CPU.
        enforce_eager: no CUDA graphs on a GPU.
        max_model_len: the engine's `max_model_len` (sizes the graphs' context buckets and
            the default grid).

    Raises:
        ValueError: settings that cannot be calibrated here (`check_setup`).
    """
    import gc

    from schedlab.model import resolve_dtype
    from schedlab.sim.model_presets import load_config_dir

    check_setup(device, dtype, attention, clock, hardware)
    spec = load_config_dir(model_dir).spec
    grid = list(grid or default_grid(max_model_len or spec.max_position_embeddings))
    base = base_profile(device, hardware, dtype, attention, Path(model_dir).name)
    opts = dict(device=device, dtype=dtype, attention=attention, enforce_eager=enforce_eager,
                max_model_len=max_model_len)
    t0 = time.perf_counter()
    times = measure_torch(model_dir, grid, repeats, block_size=block_size, clock=clock, **opts)
    gc.collect()  # the measured executor's model and cache go before the engine's come
    fit = fit_profile(spec, base, [shape_of(e, attention) for e in grid], times,
                      block_size=block_size, dtype_bytes=resolve_dtype(dtype).itemsize)
    host = (measure_host_overhead(model_dir, clock=clock, **opts) if host_overhead
            else (0.0, 0.0))
    prof = fit.profile
    fit = FitResult(replace(prof, step_overhead=prof.step_overhead + host[0],
                            seq_overhead=prof.seq_overhead + host[1]), fit.rel_errors)
    if verbose:
        print(f"measured {len(grid)} step shapes on {device} ({dtype}, attention={attention}, "
              f"{clock} time) in {time.perf_counter() - t0:.1f} s")
        print(f"{'seqs':>5} {'tokens':>7} {'context':>8} {'measured ms':>12} {'fit ms':>8} "
              f"{'err %':>7}")
        for (qs, ss), m, e in zip(grid, times, fit.rel_errors, strict=True):
            print(f"{len(qs):>5} {sum(qs):>7} {max(q + s for q, s in zip(qs, ss, strict=True)):>8} "
                  f"{m * 1e3:>12.2f} {m * (1 + e) * 1e3:>8.2f} {e * 100:>7.1f}")
        p = fit.profile
        print(f"fit: mean |error| {fit.mean_abs_error * 100:.1f}%  " + "  ".join(
            f"{k}={getattr(p, k):.4g}" for k in PARAMS))
        print(f"host overhead between steps (engine + driver): {host[0] * 1e3:.3f} ms/step + "
              f"{host[1] * 1e6:.1f} us/seq (included in step_overhead / seq_overhead)")
    if out is not None:
        path = fit.profile.save(out)
        if verbose:
            print(f"wrote {path}  (use: executor=sim hardware={path})")
    return fit


def main(argv: Sequence[str] | None = None) -> int:
    from schedlab.model import DTYPES

    ap = argparse.ArgumentParser(prog="schedlab calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="checkpoint dir (default: a small random model, built once)")
    ap.add_argument("--size", default="small", help="tiny-model size when --model is not given")
    ap.add_argument("--out", default=None,
                    help="where to write the profile JSON (default: outputs/hardware/"
                         "cpu-calibrated.json, on a GPU <hardware>-calibrated.json)")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats per shape (median)")
    ap.add_argument("--device", default="cpu", help="where the executor runs: cpu or cuda[:N]")
    ap.add_argument("--dtype", default="float32",
                    help=f"weights and KV cache dtype: {', '.join(DTYPES)}")
    ap.add_argument("--attention", default="sdpa",
                    help="attention backend the executor runs (sdpa, triton, ...)")
    ap.add_argument("--hardware", default=None,
                    help="base preset on a GPU, whose datasheet peaks the fit scales: "
                         "a100, h100, h200 (on the CPU the peaks are measured)")
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="the engine's max_model_len and the grid's longest context "
                         "(default: the model's)")
    ap.add_argument("--enforce-eager", action="store_true",
                    help="on a GPU, run decode steps eagerly instead of from CUDA graphs")
    ap.add_argument("--no-host-overhead", action="store_true",
                    help="fit the forward pass only, not the engine's time between steps")
    ap.add_argument("--clock", choices=sorted(TIMERS), default="wall",
                    help="wall time, or this thread's CPU time (steady on a busy machine; "
                         "needs --threads 1; CPU only)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (1: steadier timings on a shared machine)")
    args = ap.parse_args(argv)
    try:
        kind = check_setup(args.device, args.dtype, args.attention, args.clock, args.hardware)
    except ValueError as e:
        ap.error(str(e))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    model = args.model
    if model is None:
        from schedlab.tiny import build_tiny_model

        model = str(build_tiny_model(size=args.size))
    out = args.out or ("outputs/hardware/cpu-calibrated.json" if kind == "cpu" else
                       f"outputs/hardware/{args.hardware.lower()}-calibrated.json")
    calibrate(model, out, args.repeats, host_overhead=not args.no_host_overhead,
              clock=args.clock, device=args.device, dtype=args.dtype, attention=args.attention,
              hardware=args.hardware, enforce_eager=args.enforce_eager,
              max_model_len=args.max_model_len)
    return 0


if __name__ == "__main__":
    sys.exit(main())
