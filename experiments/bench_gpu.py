"""Issue 12's GPU table in one command: schedlab (sdpa / triton x eager / CUDA graphs, chunked
prefill), transformers (static batches, continuous batching) and the simulator's prediction on
one offline workload, plus a profiled decode step (wall time vs GPU-busy time).

    python experiments/bench_gpu.py                      # on a CUDA machine (a few minutes)
    python experiments/bench_gpu.py --smoke --out /tmp/x # anywhere: tiny model, every code path

Full run (the issue's setup): a random-weight Llama of 1.1B parameters (hidden 2048, 16
layers, 32 heads / 8 KV heads, intermediate 5632, vocab 32000) built locally, bfloat16, 256
requests at t=0, prompts uniform 64..512, outputs uniform 64..256, greedy, EOS ignored.

Engines (each timed after a warm-up run of a few requests, so Triton compilation and cuBLAS
selection are not in the timed region; CUDA-graph capture happens when the engine is built and
is reported separately as `build_s`):

- `sdpa-eager`, `sdpa-graphs`, `triton-eager`, `triton-graphs`: continuous scheduler, paged
  KV. sdpa's graphs are captured per (batch, context-length) bucket (210 graphs here: 35 batch
  sizes x 6 context lengths; triton's: 35); in the smoke run "graphs" means the padded path
  they replay, run eagerly with the metadata a capture records.
- `sdpa-chunked`, `triton-graphs-chunked`: chunked_prefill with a 2,048-token budget.
- `hf-static`: `generate()` in static batches of 64 sorted by prompt length, left padded.
- `hf-cb`: transformers' continuous batching (`init_continuous_batching`), as in
  `bench_vs_transformers.py`.
- `sim`: `executor=sim hardware=h200` (the smoke run: `hardware=cpu`) on the same model config
  and workload; its duration is the predicted one.
- `sim-calibrated`: `schedlab calibrate` on this device first (the bench's model and dtype,
  attention=triton with CUDA graphs as `triton-graphs` runs; the smoke run: sdpa, eager, as
  Triton on a CPU needs its interpreter), over `bench_grid`'s step shapes, then the same
  prediction with `hardware=<the fitted profile>` (written as `bench_gpu_sim_profile.json`
  next to bench_gpu.json, and into bench_gpu.json's `sim_calibrated`). Its note gives the
  calibration's seconds, the fit's mean error and the prediction over the engine it was
  calibrated on (`triton-graphs`; the smoke run: `sdpa-eager`) when that one ran first.

Then a decode step at ~256 running sequences (the smoke run: all of its requests) is profiled
with `torch.profiler` for each schedlab backend mode: wall time per step, GPU-busy time (sum of
the kernels' device time; one stream, so no overlap), kernels per step, and the step's host
phases from the engine's telemetry.

Writes `bench_gpu.json` (every number) and `bench_gpu.md` (the tables) into `--out`
(default: experiments/results), updated after each engine so a run cut short keeps what it did.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_transformers import HFContinuousRunner, Workload, agreement  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LLAMA_1B = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, intermediate_size=5632, vocab_size=32000)
ENGINES = ("sdpa-eager", "sdpa-graphs", "triton-eager", "triton-graphs", "sdpa-chunked",
           "triton-graphs-chunked", "hf-static", "hf-cb", "sim", "sim-calibrated")


@dataclass(slots=True)
class Setup:
    """What differs between the full run and the smoke run."""

    device: str
    dtype: str
    num_requests: int
    prompt_range: tuple[int, int]
    output_range: tuple[int, int]
    max_model_len: int
    hardware: str
    hf_batch: int
    warmup_requests: int
    profile_steps: int


FULL = Setup("cuda", "bfloat16", 256, (64, 512), (64, 256), 1024, "h200", 64, 8, 5)
SMOKE = Setup("cpu", "float32", 5, (4, 24), (2, 6), 64, "cpu", 4, 2, 1)


@dataclass(slots=True)
class Row:
    engine: str
    seconds: float | None = None
    output_tokens: int = 0
    tok_per_s: float | None = None
    num_steps: int | None = None
    build_s: float | None = None
    agreement_tokens: float | None = None  # with triton-eager (or sdpa-eager) greedy output
    note: str = ""
    phases_ms: dict[str, float] = field(default_factory=dict)


def build_model(setup: Setup, smoke: bool, cache: Path) -> str:
    """The random-weight Llama the issue measured (1.1B), or the tiny test model."""
    if smoke:
        from schedlab.tiny import build_tiny_model

        return str(build_tiny_model(cache / "llama-tiny", size="tiny",
                                    max_position_embeddings=setup.max_model_len))
    out = cache / "llama-1.1b-s0"
    if (out / "config.json").is_file():
        return str(out)
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(**LLAMA_1B, max_position_embeddings=2048, initializer_range=0.02,
                      eos_token_id=0, pad_token_id=1, bos_token_id=None,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(setup.device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out)
    return str(out)


def make_workload(setup: Setup, seed: int, vocab: int, n: int | None = None) -> Workload:
    rng = random.Random(seed)
    prompts, outs = [], []
    for _ in range(n or setup.num_requests):
        prompts.append([rng.randrange(2, vocab) for _ in range(rng.randint(*setup.prompt_range))])
        outs.append(rng.randint(*setup.output_range))
    return Workload(prompts, outs)


def _sync(setup: Setup) -> None:
    if setup.device == "cuda":
        torch.cuda.synchronize()


# ---- schedlab ---------------------------------------------------------------------------------
def schedlab_engine(name: str, model_dir: str, setup: Setup):
    from schedlab.config import EngineConfig
    from schedlab.engine import Engine

    attention = name.split("-")[0]
    chunked = name.endswith("chunked")
    graphs = "graphs" in name
    options: dict = {}
    if graphs and setup.device != "cuda":
        options["emulate_cuda_graphs"] = True  # the padded path the graphs replay, eagerly
    cfg = EngineConfig(
        model=model_dir, scheduler="chunked_prefill" if chunked else "continuous",
        attention=attention, dtype=setup.dtype, device=setup.device, max_num_seqs=256,
        max_num_batched_tokens=2048 if chunked else None, max_model_len=setup.max_model_len,
        enforce_eager=not graphs, executor_options=options,
        kv_cache_memory=None if setup.device == "cuda" else "64MiB")
    return Engine(cfg)


def run_schedlab(eng, wl: Workload, setup: Setup) -> tuple[float, list[list[int]], list]:
    from schedlab.request import SamplingParams

    first = len(eng.step_stats)
    _sync(setup)
    t0 = time.perf_counter()
    reqs = [eng.add_request(p, SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True))
            for p, o in zip(wl.prompts, wl.output_lens, strict=True)]
    eng.run_until_done()
    _sync(setup)
    seconds = time.perf_counter() - t0
    for r in reqs:
        eng.forget(r.request_id)
    return seconds, [list(r.output_token_ids) for r in reqs], eng.step_stats[first:]


def phases(steps) -> dict[str, float]:
    from schedlab.stats import step_phase_metrics

    m = step_phase_metrics(list(steps))
    m["mean_step_time_ms"] = 1000.0 * statistics.fmean(s.step_time for s in steps)
    return {k: round(v, 3) for k, v in m.items()}


# ---- transformers -----------------------------------------------------------------------------
@torch.inference_mode()
def run_hf_static(model, wl: Workload, batch: int, device: str) -> tuple[float, list[list[int]]]:
    pad = model.config.pad_token_id
    order = sorted(range(len(wl.prompts)), key=lambda i: len(wl.prompts[i]))
    outs: list[list[int]] = [[] for _ in wl.prompts]
    t0 = time.perf_counter()
    for b in range(0, len(order), batch):
        idx = order[b : b + batch]
        width = max(len(wl.prompts[i]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            p = wl.prompts[i]
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        res = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                             do_sample=False, max_new_tokens=max(wl.output_lens[i] for i in idx),
                             min_new_tokens=0, pad_token_id=pad)
        gen = res[:, width:].tolist()
        for row, i in enumerate(idx):
            outs[i] = gen[row][: wl.output_lens[i]]
    return time.perf_counter() - t0, outs


# ---- the simulator ----------------------------------------------------------------------------
def run_sim(model_dir: str, wl: Workload, setup: Setup, name: str,
            hardware: str | None = None, attention: str = "triton") -> tuple[float, int]:
    """Predicted duration of the same workload with `executor=sim hardware=<hardware>`
    (default the setup's preset) and `attention` (the decode padding the sim charges)."""
    from schedlab.config import EngineConfig
    from schedlab.engine import Engine
    from schedlab.request import SamplingParams

    chunked = name.endswith("chunked")
    cfg = EngineConfig(model=model_dir, executor="sim", attention=attention,
                       scheduler="chunked_prefill" if chunked else "continuous",
                       max_num_seqs=256, max_num_batched_tokens=2048 if chunked else None,
                       max_model_len=setup.max_model_len,
                       executor_options={"hardware": hardware or setup.hardware,
                                         "dtype": setup.dtype})
    eng = Engine(cfg)
    for p, o in zip(wl.prompts, wl.output_lens, strict=True):
        eng.add_request(p, SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True))
    eng.run_until_done()
    return eng.clock.now(), len(eng.step_stats)


# ---- the simulator, calibrated here -----------------------------------------------------------
#: timed repeats per shape of the bench's calibration (the median of 3 is fitted)
CALIBRATION_REPEATS = 3
#: what the bench's continuous engines run under: max_num_seqs, and the token budget (the
#: scheduler's default when max_num_batched_tokens is unset)
MAX_NUM_SEQS, STEP_BUDGET = 256, 2048
Shape = tuple[tuple[int, ...], tuple[int, ...]]


def calibration_attention(setup: Setup) -> tuple[str, str]:
    """(the backend the calibration runs, the bench engine that runs the same way)."""
    if setup.device == "cuda":
        return "triton", "triton-graphs"
    return "sdpa", "sdpa-eager"  # Triton on a CPU needs its interpreter (far too slow to time)


def bench_grid(setup: Setup) -> list[Shape]:
    """Step shapes like those the bench's continuous engines run on its workload, each a pair
    (query lengths, cached tokens before them), every context within `max_model_len`.

    With n requests (at most `MAX_NUM_SEQS`): decode batches of 1, n/8, n/2 and n sequences at
    three contexts (a middle prompt; it plus a middle output; the longest), and one of n over
    contexts spread from the shortest to the longest (the run's decode-only steps, which CUDA
    graphs replay); one shortest and one longest prompt, and middle prompts packed to the
    2,048-token budget (the first steps); mixed steps of n/8 and n - k decodes (k: the packed
    prompts) next to middle prompts filling the budget (admissions while others decode).
    The full run: 18 shapes (contexts up to 768), the smoke run: 14.
    """
    (p_lo, p_hi), (o_lo, o_hi) = setup.prompt_range, setup.output_range
    top = setup.max_model_len - 1  # cached tokens before a decode's one
    n = min(setup.num_requests, MAX_NUM_SEQS)
    p_mid, o_mid = (p_lo + p_hi) // 2, (o_lo + o_hi) // 2
    ctx = sorted({min(top, c) for c in (p_mid, p_mid + o_mid, p_hi + o_hi - 1)})

    def spread(b: int, lo: int, hi: int) -> tuple[int, ...]:
        hi = min(top, hi)
        return tuple(lo + (hi - lo) * i // max(1, b - 1) for i in range(b))

    grid: list[Shape] = []
    for b in sorted({1, max(1, n // 8), max(1, n // 2), n}):
        grid += [((1,) * b, (c,) * b) for c in ctx]
    grid.append(((1,) * n, spread(n, p_lo, p_hi + o_hi - 1)))
    k = max(1, min(n, STEP_BUDGET // p_mid))
    grid += [((p_lo,), (0,)), ((p_hi,), (0,)), ((p_mid,) * k, (0,) * k)]
    for b in sorted({max(1, n // 8), max(1, n - k)}):
        m = max(1, min(n - b, (STEP_BUDGET - b) // p_mid))
        grid.append(((1,) * b + (p_mid,) * m, spread(b, p_lo, p_hi) + (0,) * m))
    return grid


def sweep_estimate_s(grid: list[Shape], repeats: int, step_s: float = 0.03,
                     warm_s: float = 0.02) -> float:
    """Seconds `measure_torch` spends on `grid` if no step takes longer than `step_s`: every
    shape runs twice untimed (first-call costs, the warm-up's sizing), then `repeats` times
    about `warm_s` of untimed runs of it and one timed run. 30 ms bounds an eager step of the
    1.1B model (eager sdpa decodes ~20 ms, launch-bound; a 2,048-token prefill ~10 ms)."""
    return len(grid) * (2 * step_s + repeats * (warm_s + step_s))


def run_sim_calibrated(model_dir: str, wl: Workload, setup: Setup,
                       out: Path) -> tuple[float, int, dict]:
    """Calibrate the simulator on this device (`schedlab calibrate` over `bench_grid`), write
    the profile next to bench_gpu.json, and predict the workload with it.

    Returns (predicted seconds, steps, what the calibration did: profile, seconds, errors)."""
    from schedlab.calibration.calibrate import calibrate

    attention, engine = calibration_attention(setup)
    grid = bench_grid(setup)
    path = out / "bench_gpu_sim_profile.json"
    t = time.perf_counter()
    fit = calibrate(model_dir, out=path, repeats=CALIBRATION_REPEATS, grid=grid,
                    device=setup.device, dtype=setup.dtype, attention=attention,
                    hardware=setup.hardware, max_model_len=setup.max_model_len)
    seconds = time.perf_counter() - t
    _sync(setup)
    gc.collect()  # the calibration's model and KV cache, before the next engine
    if setup.device == "cuda":
        torch.cuda.empty_cache()
    secs, steps = run_sim(model_dir, wl, setup, "sim-calibrated", hardware=str(path),
                          attention=attention)
    info = dict(profile_path=path.name, calibrated_on=engine, attention=attention,
                calibration_s=round(seconds, 2),
                sweep_estimate_s=round(sweep_estimate_s(grid, CALIBRATION_REPEATS), 1),
                repeats=CALIBRATION_REPEATS, fit_mean_abs_error=round(fit.mean_abs_error, 4),
                grid=[dict(seqs=len(q), tokens=sum(q), max_context=max(a + b for a, b in
                                                                       zip(q, s, strict=True)),
                           rel_error=round(e, 4))
                      for (q, s), e in zip(grid, fit.rel_errors, strict=True)],
                profile=fit.profile.to_dict())
    return secs, steps, info


# ---- a profiled decode step -------------------------------------------------------------------
def profile_decode(eng, setup: Setup, wl: Workload) -> dict:
    """Fill the engine with `wl` (all at once), step until every request decodes, then profile
    `setup.profile_steps` decode steps."""
    from torch.profiler import ProfilerActivity, profile

    from schedlab.request import SamplingParams

    big = max(wl.output_lens) + 2 * setup.profile_steps + 8
    reqs = [eng.add_request(p, SamplingParams(temperature=0.0, max_tokens=big, ignore_eos=True))
            for p in wl.prompts]
    while any(not r.output_token_ids for r in reqs):  # until every prefill is done
        eng.step()
    activities = [ProfilerActivity.CPU]
    if setup.device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    first = len(eng.step_stats)
    _sync(setup)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(setup.profile_steps):
            eng.step()
        _sync(setup)
        wall = (time.perf_counter() - t0) / setup.profile_steps
    steps = eng.step_stats[first:]
    busy = kernels = None
    if setup.device == "cuda":
        dev = [e for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")]
        kernels = len(dev) / setup.profile_steps
        busy = sum(getattr(e, "device_time", 0.0) or getattr(e, "cuda_time", 0.0)
                   for e in dev) / 1e6 / setup.profile_steps
    for r in reqs:
        if not r.is_finished:
            eng.abort(r.request_id)
        eng.forget(r.request_id)
    return dict(num_seqs=steps[0].num_scheduled_seqs if steps else 0,
                wall_ms=round(1000 * wall, 3),
                gpu_busy_ms=None if busy is None else round(1000 * busy, 3),
                gpu_busy_pct=None if busy is None else round(100 * busy / wall, 1),
                kernels_per_step=kernels, **phases(steps))


# ---- the run ----------------------------------------------------------------------------------
def write(out: Path, meta: dict, rows: list[Row], profiles: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = dict(meta, rows=[asdict(r) for r in rows], decode_step_profiles=profiles)
    (out / "bench_gpu.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# bench_gpu ({meta['mode']})", "", f"{meta['description']}", "",
             "| engine | seconds | output tok/s | steps | agreement | note |",
             "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        secs = "-" if r.seconds is None else f"{r.seconds:.2f}"
        tps = "-" if r.tok_per_s is None else f"{r.tok_per_s:,.0f}"
        agr = "-" if r.agreement_tokens is None else f"{100 * r.agreement_tokens:.1f}%"
        lines.append(f"| {r.engine} | {secs} | {tps} | {r.num_steps or '-'} | {agr} | {r.note} |")
    if profiles:
        lines += ["", "Decode step profile:", "",
                  "| engine | seqs | wall ms | GPU busy ms | busy % | kernels | host ms: "
                  "schedule / prepare / forward / wait / sample / update |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        for name, p in profiles.items():
            host = " / ".join(f"{p.get(f'mean_{k}_time_ms', 0):.2f}" for k in
                              ("schedule", "prepare", "forward", "device_wait", "sample",
                               "update"))
            lines.append(f"| {name} | {p['num_seqs']} | {p['wall_ms']} | {p['gpu_busy_ms']} | "
                         f"{p['gpu_busy_pct']} | {p['kernels_per_step']} | {host} |")
    (out / "bench_gpu.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    threads = torch.get_num_threads()
    try:
        return _main(argv)
    finally:
        torch.set_num_threads(threads)


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true",
                    help="tiny model and workload on whatever device there is (a test)")
    ap.add_argument("--engines", default=None,
                    help=f"comma-separated subset of {', '.join(ENGINES)} (default: all)")
    ap.add_argument("--num-requests", type=int, default=None)
    ap.add_argument("--no-profile", action="store_true", help="skip the profiled decode steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    ap.add_argument("--cache", type=Path, default=None, help="where the model is built")
    ap.add_argument("--model", default=None,
                    help="an existing checkpoint directory instead of the built one")
    args = ap.parse_args(argv)
    setup = SMOKE if args.smoke else FULL
    if args.num_requests:
        setup = replace(setup, num_requests=args.num_requests)
    if setup.device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device; run with --smoke for the CPU check", file=sys.stderr)
        return 2
    wanted = [e.strip() for e in (args.engines or ",".join(ENGINES)).split(",") if e.strip()]
    unknown = sorted(set(wanted) - set(ENGINES))
    if unknown:
        ap.error(f"unknown engines {unknown}; accepted: {', '.join(ENGINES)}")
    interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if setup.device == "cpu" and not interpret:
        skipped = [e for e in wanted if e.startswith("triton")]
        wanted = [e for e in wanted if not e.startswith("triton")]
        if skipped:
            print(f"bench_gpu: {', '.join(skipped)} skipped: Triton on a CPU needs "
                  "TRITON_INTERPRET=1 before start", file=sys.stderr)

    from transformers.utils import logging as hf_logging

    from schedlab.runs.results import collect_environment
    from schedlab.shapes import ModelSpec

    hf_logging.set_verbosity_error()
    torch.manual_seed(args.seed)
    if setup.device == "cpu":
        # NOTE: one thread: on a small shared CPU every op of a tiny model otherwise waits
        # ~20 ms at an OpenMP barrier for a descheduled thread
        torch.set_num_threads(1)
    cache = args.cache or (Path(os.environ.get("SCHEDLAB_CACHE", Path.home() / ".cache"
                                               / "schedlab")))
    model_dir = args.model or build_model(setup, args.smoke, cache)
    spec = ModelSpec.from_pretrained(model_dir)
    wl = make_workload(setup, args.seed, spec.vocab_size)
    warm = make_workload(setup, args.seed + 1, spec.vocab_size, setup.warmup_requests)
    meta = dict(mode="smoke" if args.smoke else "full", setup=asdict(setup),
                description=(f"{spec.num_params / 1e9:.2f}B-parameter random Llama, "
                             f"{setup.dtype}, {setup.device}, {len(wl.prompts)} requests, "
                             f"{wl.num_output_tokens} output tokens, greedy, ignore_eos"),
                environment=collect_environment())
    rows: list[Row] = []
    profiles: dict[str, dict] = {}
    outputs: dict[str, list[list[int]]] = {}
    reference = None

    for name in wanted:
        row = Row(name)
        rows.append(row)
        try:
            if name == "sim":
                secs, row.num_steps = run_sim(model_dir, wl, setup, name)
                row.seconds, row.output_tokens = secs, wl.num_output_tokens
                row.note = f"predicted, hardware={setup.hardware}"
            elif name == "sim-calibrated":
                secs, row.num_steps, info = run_sim_calibrated(model_dir, wl, setup, args.out)
                meta["sim_calibrated"] = info
                row.seconds, row.output_tokens = secs, wl.num_output_tokens
                ref = next((r for r in rows if r.engine == info["calibrated_on"] and r.seconds),
                           None)
                err = 100 * info["fit_mean_abs_error"]
                row.note = (f"predicted, hardware={info['profile_path']} (calibrated on "
                            f"{setup.device}, {info['attention']}, in "
                            f"{info['calibration_s']:.1f} s; fit error {err:.1f}% mean abs.)")
                if ref:
                    row.note += f"; {secs / ref.seconds:.2f}x {ref.engine}'s {ref.seconds:.2f} s"
            elif name.startswith("hf-"):
                from transformers import AutoModelForCausalLM

                hf = AutoModelForCausalLM.from_pretrained(
                    model_dir, dtype=getattr(torch, setup.dtype),
                    attn_implementation="sdpa").to(setup.device).eval()
                hf.generation_config.eos_token_id = None
                if name == "hf-static":
                    run_hf_static(hf, warm, setup.hf_batch, setup.device)
                    secs, outs = run_hf_static(hf, wl, setup.hf_batch, setup.device)
                    row.note = f"static batches of {setup.hf_batch}"
                else:
                    res = HFContinuousRunner(hf, 2048).run(wl)
                    secs, outs = res.seconds, res.outputs
                row.seconds, row.output_tokens = secs, wl.num_output_tokens
                outputs[name] = outs
                del hf
            else:
                t = time.perf_counter()
                eng = schedlab_engine(name, model_dir, setup)
                row.build_s = round(time.perf_counter() - t, 2)
                run_schedlab(eng, warm, setup)
                secs, outs, steps = run_schedlab(eng, wl, setup)
                row.seconds, row.output_tokens = secs, sum(map(len, outs))
                row.num_steps = len(steps)
                row.phases_ms = phases(steps)
                runner = eng.executor.graph_runner
                row.note = ("graphs " + ("captured" if runner.capture else "emulated (padded)")
                            + f" for {len(runner.sizes)} sizes x {len(runner.context_lens)} "
                            "context lengths") if runner else "eager"
                if "graphs" in name and runner is None:
                    row.note = f"eager: {name.split('-')[0]} cannot be captured"
                outputs[name] = outs
                if reference is None:
                    reference = name
                if not args.no_profile and not name.endswith("chunked"):
                    n = min(256, setup.num_requests)
                    pw = make_workload(setup, args.seed + 2, spec.vocab_size, n)
                    profiles[name] = profile_decode(eng, setup, pw)
                del eng
            if row.seconds:
                row.tok_per_s = row.output_tokens / row.seconds
            if name in outputs and reference and name != reference:
                row.agreement_tokens = agreement(outputs[reference], outputs[name])[0]
        except Exception as e:  # one engine failing must not lose the others' numbers
            row.note = f"FAILED: {type(e).__name__}: {e}"[:300]
            print(f"bench_gpu: {name} failed: {e!r}", file=sys.stderr)
        eng = hf = None  # a failed engine too: the next one sizes its KV pool from free memory
        if setup.device == "cuda":
            gc.collect()  # the engine's KV pool goes before the next one is sized
            torch.cuda.empty_cache()
        print(f"{name:<24} {row.seconds or 0:8.2f} s {row.tok_per_s or 0:10,.0f} tok/s  "
              f"{row.note}", flush=True)
        write(args.out, meta, rows, profiles)
    print((args.out / "bench_gpu.md").read_text())
    return 1 if any(r.note.startswith("FAILED") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
