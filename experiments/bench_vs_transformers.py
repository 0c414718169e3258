"""schedlab against transformers on transformers' own model, in one process, same requests.

    .venv/bin/python experiments/bench_vs_transformers.py --rounds 3

Workload (seed 0): 64 requests, prompt lengths uniform in [16, 256], output lengths uniform in
[16, 64], random prompt tokens, greedy, EOS ignored; a random-weight Llama of ~150M parameters
(`schedlab.tiny.build_tiny_model(size="150m")`) in float32 on the CPU.

Engines, run in turn within every round (the order rotates each round, so drift in machine load
spreads over all of them):

- `schedlab`: continuous scheduler, paged KV, sdpa backend (and `schedlab-chunked` with the
  chunked_prefill scheduler when its plugin loads).
- `hf-static`: `model.generate()` in static batches of 16 requests sorted by prompt length, left
  padded, greedy. A batch runs to its longest output (max_new_tokens = the batch's largest
  output length, EOS disabled, which is `ignore_eos`); each request is credited with its own
  output length only, and its agreement is checked on those tokens. The extra tokens a short
  request produces while the batch finishes are the waste static batching pays.
- `hf-cb`: transformers' continuous batching (`ContinuousBatchingManager`, sdpa, paged cache
  sized explicitly: enough pages for every request at full length, `max_batch_tokens` equal to
  schedlab's token budget), each request added with its own `max_new_tokens` and EOS disabled.
  Building the manager (cache allocation) is outside the timed region; start, submission and
  collection of every result are inside.

Reported per engine: output tokens/s (the median and spread over rounds), its ratio to
schedlab's in the same round (median, min, max), greedy agreement with schedlab, and the
fraction of the FLOP roofline: the workload's FLOPs (2 x layer parameters x tokens processed,
plus the LM head at sampled positions, plus causal attention) over this machine's float32
matmul rate (a large `torch.mm`, measured in the same run before each round; the best round
is the hardware's limit). For schedlab also the framework-time fraction: schedule + update
(`Engine.step_stats[i].framework_time`) plus `TorchExecutor.prepare` over the wall time.

The same ratios and roofline are also given in process CPU time (all threads): on a machine
shared with other jobs, wall time swings by 2x from one minute to the next while CPU time at
one thread barely moves, so the CPU-time columns are the steadier comparison.

`--threads` (default 1) sets torch's intra-op threads for every engine alike. On a small
machine shared with other processes one thread is the sensible choice: with two, every small
op waits at an OpenMP barrier for a thread the OS has descheduled.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402


@dataclass(slots=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)


@dataclass(slots=True)
class RunResult:
    engine: str
    seconds: float
    outputs: list[list[int]]  # each request's own output tokens, in workload order
    num_output_tokens: int
    framework_seconds: float | None = None
    num_steps: int | None = None
    cpu_seconds: float = 0.0  # process CPU time (all threads), filled in by the round loop
    extra: dict = field(default_factory=dict)

    @property
    def tok_per_s(self) -> float:
        return self.num_output_tokens / self.seconds


def make_workload(n: int, seed: int, vocab_size: int, prompt_range=(16, 256),
                  output_range=(16, 64)) -> Workload:
    rng = random.Random(seed)
    prompts, outs = [], []
    for _ in range(n):
        p = rng.randint(*prompt_range)
        prompts.append([rng.randrange(2, vocab_size) for _ in range(p)])
        outs.append(rng.randint(*output_range))
    return Workload(prompts, outs)


# ---- FLOPs and the roofline ------------------------------------------------------------------
def workload_flops(spec, wl: Workload) -> float:
    """The FLOPs the workload needs: every prompt token and every output token but the last
    runs through the layers; the LM head runs once per output token; attention is causal."""
    h, d = spec.hidden_size, spec.head_dim
    layer_params = (h * d * (2 * spec.num_heads + 2 * spec.num_kv_heads)
                    + 3 * h * spec.intermediate_size)
    flops = 0.0
    for prompt, out in zip(wl.prompts, wl.output_lens, strict=True):
        n = len(prompt) + out - 1  # tokens processed
        flops += 2.0 * spec.num_layers * layer_params * n
        flops += 2.0 * h * spec.vocab_size * out
        # QK^T and AV: 2 x 2 x heads x head_dim per (query, key) pair, keys 1..n causal
        flops += spec.num_layers * 4.0 * spec.num_heads * d * (n * (n + 1) / 2)
    return flops


def matmul_rate(n: int = 2048, reps: int = 6) -> tuple[float, float]:
    """float32 FLOP/s of a large torch.mm (median of `reps`): per wall second, per CPU second."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    c = torch.empty(n, n)
    for _ in range(2):
        torch.mm(a, b, out=c)
    wall, cpu = [], []
    for _ in range(reps):
        t, tc = time.perf_counter(), time.process_time()
        torch.mm(a, b, out=c)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - tc)
    return 2.0 * n**3 / statistics.median(wall), 2.0 * n**3 / statistics.median(cpu)


# ---- schedlab ---------------------------------------------------------------------------------
class SchedlabRunner:
    def __init__(self, name: str, model_dir: str, scheduler: str, max_model_len: int,
                 budget: int) -> None:
        from schedlab.config import EngineConfig
        from schedlab.engine import Engine

        self.name = name
        cfg = EngineConfig(model=model_dir, scheduler=scheduler, kv_allocator="paged",
                           attention="sdpa", dtype="float32", device="cpu",
                           max_num_seqs=256, max_num_batched_tokens=budget,
                           max_model_len=max_model_len, kv_cache_memory="768MiB")
        self.engine = Engine(cfg)
        self.prepare_seconds = 0.0
        ex = self.engine.executor
        prepare = ex.prepare

        def timed_prepare(plan):
            t = time.perf_counter()
            r = prepare(plan)
            self.prepare_seconds += time.perf_counter() - t
            return r

        ex.prepare = timed_prepare  # instance attribute: times the engine's own batch building

    def run(self, wl: Workload) -> RunResult:
        from schedlab.request import SamplingParams

        eng = self.engine
        first_step = len(eng.step_stats)
        self.prepare_seconds = 0.0
        t0 = time.perf_counter()
        reqs = [eng.add_request(p, SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True))
                for p, o in zip(wl.prompts, wl.output_lens, strict=True)]
        eng.run_until_done()
        seconds = time.perf_counter() - t0
        stats = eng.step_stats[first_step:]
        fw = sum(s.framework_time for s in stats) + self.prepare_seconds
        outs = [list(r.output_token_ids) for r in reqs]
        for r in reqs:  # keep the engine's request table small across rounds
            eng.requests.pop(r.request_id, None)
        return RunResult(self.name, seconds, outs, sum(len(o) for o in outs),
                         framework_seconds=fw, num_steps=len(stats),
                         extra=dict(prepare=self.prepare_seconds,
                                    model=sum(s.step_time for s in stats)))


# ---- transformers -----------------------------------------------------------------------------
class HFStaticRunner:
    name = "hf-static"

    def __init__(self, model, pad_id: int, batch_size: int = 16) -> None:
        self.model = model
        self.pad_id = pad_id
        self.batch_size = batch_size

    @torch.inference_mode()
    def run(self, wl: Workload) -> RunResult:
        order = sorted(range(len(wl.prompts)), key=lambda i: len(wl.prompts[i]))
        outs: list[list[int]] = [[] for _ in wl.prompts]
        generated = 0
        t0 = time.perf_counter()
        for b in range(0, len(order), self.batch_size):
            idx = order[b : b + self.batch_size]
            width = max(len(wl.prompts[i]) for i in idx)
            ids = torch.full((len(idx), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for row, i in enumerate(idx):
                p = wl.prompts[i]
                ids[row, width - len(p):] = torch.tensor(p)
                mask[row, width - len(p):] = 1
            new = max(wl.output_lens[i] for i in idx)
            res = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                      max_new_tokens=new, min_new_tokens=0,
                                      pad_token_id=self.pad_id)
            gen = res[:, width:]
            generated += gen.numel()
            for row, i in enumerate(idx):
                outs[i] = gen[row, : wl.output_lens[i]].tolist()
        seconds = time.perf_counter() - t0
        return RunResult(self.name, seconds, outs, wl.num_output_tokens,
                         extra=dict(generated=generated))


class HFContinuousRunner:
    name = "hf-cb"

    def __init__(self, model, budget: int, page_size: int = 256) -> None:
        self.model = model
        self.budget = budget
        self.page_size = page_size

    def run(self, wl: Workload) -> RunResult:
        from transformers import ContinuousBatchingConfig, GenerationConfig

        n = len(wl.prompts)
        longest = max(len(p) + o for p, o in zip(wl.prompts, wl.output_lens, strict=True))
        pages_per_req = -(-longest // self.page_size)
        cb_cfg = ContinuousBatchingConfig(
            page_size=self.page_size,
            num_blocks=n * pages_per_req + 8,
            max_batch_tokens=self.budget,
            max_requests_per_batch=n,
            allow_block_sharing=False,
            auto_switch_to_flash=False,
            use_cuda_graph=False,
        )
        gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=max(wl.output_lens),
                                   eos_token_id=-1, pad_token_id=self.model.config.pad_token_id)
        manager = self.model.init_continuous_batching(generation_config=gen_cfg,
                                                      continuous_batching_config=cb_cfg)
        outs: dict[str, list[int]] = {}
        try:
            t0 = time.perf_counter()
            manager.start()
            ids = [manager.add_request(p, request_id=f"r{i}", max_new_tokens=o, eos_token_id=-1)
                   for i, (p, o) in enumerate(zip(wl.prompts, wl.output_lens, strict=True))]
            while len(outs) < n:
                r = manager.get_result(timeout=1)
                if r is None:
                    if not manager.is_running():
                        raise RuntimeError("transformers' continuous batching loop stopped")
                    continue
                if r.is_finished():
                    if r.error is not None:
                        raise RuntimeError(f"hf-cb request {r.request_id}: {r.error}")
                    outs[r.request_id] = list(r.generated_tokens)
            seconds = time.perf_counter() - t0
        finally:
            manager.stop(block=True, timeout=10)
            manager.destroy()
            self.model.destroy_cached_continuous_batching_manager()
        ordered = [outs[i] for i in ids]
        return RunResult(self.name, seconds, ordered, sum(len(o) for o in ordered))


# ---- reporting -------------------------------------------------------------------------------
def agreement(ref: list[list[int]], other: list[list[int]]) -> tuple[float, float]:
    """(token agreement: tokens before each request's first divergence over all tokens,
    fraction of requests identical)."""
    same_tok = total = same_req = 0
    for a, b in zip(ref, other, strict=True):
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        same_tok += k
        total += len(a)
        same_req += a == b
    return same_tok / max(total, 1), same_req / max(len(ref), 1)


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):7.2f} [{min(xs):.2f}..{max(xs):.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--engines", default="schedlab,schedlab-chunked,hf-static,hf-cb",
                    help="comma-separated subset of the engines")
    ap.add_argument("--size", default="150m", help="schedlab.tiny size preset")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from schedlab import registry
    from schedlab.shapes import ModelSpec
    from schedlab.tiny import build_tiny_model

    hf_logging.set_verbosity_error()
    model_dir = str(build_tiny_model(size=args.size))
    spec = ModelSpec.from_pretrained(model_dir)
    wl = make_workload(args.num_requests, args.seed, spec.vocab_size)
    budget = 2048
    max_len = 512
    wanted = args.engines.split(",")

    runners = []
    if "schedlab" in wanted:
        runners.append(SchedlabRunner("schedlab", model_dir, "continuous", max_len, budget))
    if "schedlab-chunked" in wanted:
        try:
            registry.load("scheduler", "chunked_prefill")
        except registry.PluginError as e:
            print(f"schedlab-chunked skipped: {e}")
        else:
            runners.append(SchedlabRunner("schedlab-chunked", model_dir, "chunked_prefill",
                                          max_len, budget))
    if {"hf-static", "hf-cb"} & set(wanted):
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                  attn_implementation="sdpa").eval()
        hf.generation_config.eos_token_id = None  # ignore_eos, like the others
        if "hf-static" in wanted:
            runners.append(HFStaticRunner(hf, pad_id=hf.config.pad_token_id))
        if "hf-cb" in wanted:
            runners.append(HFContinuousRunner(hf, budget))
    if not runners:
        raise SystemExit(f"no engine selected from {args.engines!r}")

    flops = workload_flops(spec, wl)
    # NOTE: the literal "2 x params x tokens" (LM head on every prompt token too, which no
    # engine here computes) would be larger; the tighter count above is the one reported.
    literal = 2.0 * (spec.num_params - spec.vocab_size * spec.hidden_size) * sum(
        len(p) + o - 1 for p, o in zip(wl.prompts, wl.output_lens, strict=True))
    print(f"model {model_dir}: {spec.num_params / 1e6:.0f}M params, {spec.num_layers} layers; "
          f"{args.threads} threads; {len(wl.prompts)} requests, "
          f"{sum(map(len, wl.prompts))} prompt + {wl.num_output_tokens} output tokens; "
          f"{flops / 1e12:.3f} TFLOP needed (2 x params x tokens incl. the LM head on every "
          f"token: {literal / 1e12:.3f})")

    warm = make_workload(4, args.seed + 1, spec.vocab_size, (8, 32), (2, 4))
    for r in runners:
        r.run(warm)

    results: dict[str, list[RunResult]] = {r.name: [] for r in runners}
    rates: list[tuple[float, float]] = []
    for rnd in range(args.rounds):
        rates.append(matmul_rate())
        k = rnd % len(runners)
        for r in runners[k:] + runners[:k]:
            cpu0 = time.process_time()
            res = r.run(wl)
            res.cpu_seconds = time.process_time() - cpu0
            results[r.name].append(res)
            fw = (f" framework {100 * res.framework_seconds / res.seconds:.2f}% "
                  f"({res.num_steps} steps)" if res.framework_seconds is not None else "")
            print(f"round {rnd} {r.name:17s} {res.seconds:7.2f}s wall {res.cpu_seconds:7.2f}s cpu "
                  f"{res.tok_per_s:7.2f} tok/s{fw}", flush=True)
    report(results, rates, flops, wl)


def report(results: dict[str, list[RunResult]], rates: list[tuple[float, float]], flops: float,
           wl: Workload) -> None:
    peak = max(w for w, _ in rates)
    peak_cpu = max(c for _, c in rates)
    base_name = next(iter(results))
    base = results[base_name]
    print(f"\nfloat32 matmul rate (torch.mm 2048^2), per round: "
          f"{spread([w / 1e9 for w, _ in rates])} GFLOP/s wall, "
          f"{spread([c / 1e9 for _, c in rates])} GFLOP per CPU-s. Roofline = the best: "
          f"{peak / 1e9:.1f} GFLOP/s -> {flops / peak:.1f} s, "
          f"{wl.num_output_tokens * peak / flops:.1f} output tok/s")
    print(f"\n{'engine':17s} {'tok/s [min..max]':>24s} {base_name + '/engine wall':>24s} "
          f"{base_name + '/engine cpu':>24s} {'roofline':>8s} {'roof-cpu':>8s} "
          f"{'agree tok/req %':>15s} {'framework':>9s}")
    for name, rs in results.items():
        # same round: base speed / this engine's speed (the workload is the same)
        wall = [r.seconds / b.seconds for b, r in zip(base, rs, strict=True)]
        cpu = [r.cpu_seconds / b.cpu_seconds for b, r in zip(base, rs, strict=True)]
        roof = statistics.median(flops / peak / r.seconds for r in rs)
        roof_cpu = statistics.median(flops / peak_cpu / r.cpu_seconds for r in rs)
        tok_agree, req_agree = agreement(base[-1].outputs, rs[-1].outputs)
        fw = ("" if rs[0].framework_seconds is None else
              f"{100 * statistics.median(r.framework_seconds / r.seconds for r in rs):8.2f}%")
        print(f"{name:17s} {spread([r.tok_per_s for r in rs]):>24s} {spread(wall):>24s} "
              f"{spread(cpu):>24s} {100 * roof:7.1f}% {100 * roof_cpu:7.1f}% "
              f"{100 * tok_agree:7.1f}/{100 * req_agree:5.1f}  {fw:>9s}")

if __name__ == "__main__":
    main()
