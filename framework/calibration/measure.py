"""Timing the real executor for `schedlab calibrate`: the clocks, the grid of step shapes, the
median time of each shape, and the host time between steps of a real engine run."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from schedlab.clock import TIMERS, Clock, CPUTimeClock
from schedlab.config import DEFAULT_BLOCK_SIZE
from schedlab.sim.costmodel import StepShape

#: (query lengths, cached tokens before them), one entry per sequence
Shape = tuple[tuple[int, ...], tuple[int, ...]]


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


def backend_pad_waste(attention: str = "sdpa",
                      options: dict[str, Any] | None = None) -> float | None:
    """The decode padding the attention backend `attention` declares (its class attribute
    `decode_pad_waste`, or the `decode_pad_waste` of its options): None for a backend that
    reads each decode's own context only. Loads the backend (and so torch)."""
    from schedlab import registry

    waste = getattr(registry.load("attention", attention), "decode_pad_waste", None)
    if waste is not None and options and "decode_pad_waste" in options:
        waste = float(options["decode_pad_waste"])
    return waste


def shape_of(entry: Shape, attention: str = "sdpa") -> StepShape:
    """A grid entry's shape, its decodes padded as the backend `attention` declares."""
    return StepShape.from_lens(entry[0], entry[1], pad_waste=backend_pad_waste(attention))


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

    def execute(self, plan):  # the forward passes, timed by this measurement's timer
        t0 = timer()
        out = base.execute(self, plan)
        durations.append(timer() - t0)
        return out

    TimedExecutor = type("TimedExecutor", (base,), {"execute": execute})

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
