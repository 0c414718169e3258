"""`schedlab calibrate`: time the real executor over a grid of step shapes, fit the cost model.

The real `TorchExecutor` runs a model (by default a small random-weight one, float32 on the
CPU with the sdpa backend; `--device cuda --dtype bfloat16 --attention triton --hardware h200`
on a GPU) over prefill chunks, decode batches and context lengths; the median time of each
shape is fitted by least squares (the efficiency factors and the overheads of
`HardwareProfile`), and the profile is written as JSON for `executor=sim` (`hardware=<path>`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from schedlab.calibration.costfit import PARAMS, FitResult, fit_profile
from schedlab.calibration.measure import (
    TIMERS,
    Shape,
    backend_pad_waste,
    default_grid,
    measure_host_overhead,
    measure_torch,
    shape_of,
)
from schedlab.calibration.profile_csv import GROUPS, OperatorFit
from schedlab.config import DEFAULT_BLOCK_SIZE
from schedlab.sim.hardware import PRESETS, HardwareProfile, probe_cpu

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
    simulator's default element size), and `decode_pad_waste` is what the backend `attention`
    declares (None, as triton: each decode reads its own context).
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
                       kv_write_efficiency=1.0, elementwise_efficiency=1.0,
                       step_overhead=0.0, seq_overhead=0.0, prefill_overhead=0.0)
    name = str(resolve_dtype(dtype)).removeprefix("torch.")
    return replace(base, dtype=name,
                   decode_pad_waste=backend_pad_waste(attention))


def calibrate(model_dir: str, out: str | Path | None = None, repeats: int = 5,
              grid: Sequence[Shape] | None = None, verbose: bool = True,
              host_overhead: bool = True, clock: str = "wall",
              block_size: int = DEFAULT_BLOCK_SIZE, device: str = "cpu",
              dtype: str = "float32", attention: str = "sdpa", hardware: str | None = None,
              enforce_eager: bool = False, max_model_len: int | None = None,
              hold_out: int = 0) -> FitResult:
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
        hold_out: leave every `hold_out`-th grid shape out of the fit and report its error
            (0: fit them all).

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
    opts: dict[str, Any] = dict(device=device, dtype=dtype, attention=attention,
                                enforce_eager=enforce_eager, max_model_len=max_model_len)
    t0 = time.perf_counter()
    times = measure_torch(model_dir, grid, repeats, block_size=block_size, clock=clock, **opts)
    gc.collect()  # the measured executor's model and cache go before the engine's come
    fit = fit_profile(spec, base, [shape_of(e, attention) for e in grid], times,
                      block_size=block_size, dtype_bytes=resolve_dtype(dtype).itemsize,
                      hold_out=hold_out)
    host = (measure_host_overhead(model_dir, clock=clock, **opts) if host_overhead
            else (0.0, 0.0))
    prof = fit.profile
    fit = FitResult(replace(prof, step_overhead=prof.step_overhead + host[0],
                            seq_overhead=prof.seq_overhead + host[1]), fit.rel_errors,
                    fit.held_out)
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
        if fit.held_out_error is not None:
            print(f"held-out shapes ({len(fit.held_out)}): mean |error| "
                  f"{fit.held_out_error * 100:.1f}%")
        print(f"host overhead between steps (engine + driver): {host[0] * 1e3:.3f} ms/step + "
              f"{host[1] * 1e6:.1f} us/seq (included in step_overhead / seq_overhead)")
    if out is not None:
        path = fit.profile.save(out)
        if verbose:
            print(f"wrote {path}  (use: executor=sim hardware={path})")
    return fit


def calibrate_operators(model_dir: str, csv_path: str | Path, out: str | Path | None = None,
                        measure: bool = False, device: str = "cpu", dtype: str = "float32",
                        attention: str = "sdpa", hardware: str | None = None, repeats: int = 5,
                        hold_out: int = 4, verbose: bool = True) -> OperatorFit:
    """Fit the operator terms of the base profile (`base_profile`) to an operator-profile
    CSV, after timing the model's operators here into it when `measure`; print each
    operator's error on fitted and held-out shapes; save the profile to `out` if given.

    The fixed per-step overheads stay at the base's: operator times do not contain them
    (a step-level `calibrate` fits those).
    """
    from schedlab.calibration.measure_ops import measure_operators
    from schedlab.calibration.profile_csv import fit_operators, read_profile, write_profile
    from schedlab.model import resolve_dtype
    from schedlab.sim.model_presets import load_config_dir

    spec = load_config_dir(model_dir).spec
    if measure:
        write_profile(csv_path, measure_operators(spec, device, dtype, repeats))
        if verbose:
            print(f"wrote the operator times to {csv_path}")
    base = base_profile(device, hardware, dtype, attention, Path(model_dir).name)
    fit = fit_operators(spec, base, read_profile(csv_path), resolve_dtype(dtype).itemsize,
                        hold_out)
    if verbose:
        print("\n".join(fit.summary()))
        p = fit.profile
        print("fit: " + "  ".join(f"{k}={getattr(p, k):.4g}" for _, ks in GROUPS for k in ks))
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
    ap.add_argument("--hold-out", type=int, default=None, metavar="K",
                    help="leave every K-th shape out of the fit and report its error "
                         "(default: none for steps, 4 for --operators)")
    ap.add_argument("--operators", default=None, metavar="CSV",
                    help="fit each operator's terms to an operator profile CSV (format: "
                         "schedlab.calibration.profile_csv) instead of timing whole steps")
    ap.add_argument("--measure-operators", action="store_true",
                    help="with --operators: time the model's operators here first and write "
                         "them to that CSV")
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
    if args.measure_operators and not args.operators:
        ap.error("--measure-operators needs --operators CSV (where to write the times)")
    if args.operators:
        try:
            calibrate_operators(model, args.operators, out, measure=args.measure_operators,
                                device=args.device, dtype=args.dtype, attention=args.attention,
                                hardware=args.hardware, repeats=args.repeats,
                                hold_out=4 if args.hold_out is None else args.hold_out)
        except (ValueError, FileNotFoundError) as e:
            ap.error(str(e))
        return 0
    calibrate(model, out, args.repeats, host_overhead=not args.no_host_overhead,
              clock=args.clock, device=args.device, dtype=args.dtype, attention=args.attention,
              hardware=args.hardware, enforce_eager=args.enforce_eager,
              max_model_len=args.max_model_len, hold_out=args.hold_out or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
