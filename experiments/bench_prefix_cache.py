"""Prefix caching on a shared-system-prompt workload: mean TTFT and hit rate per cache.

    .venv/bin/python experiments/bench_prefix_cache.py --rounds 2

Workload (seed 0): 32 requests, one shared prefix of 256 random tokens (a system prompt)
followed by 16-48 tokens of their own, 16 output tokens each (EOS ignored), submitted at once
(offline); continuous scheduler, paged KV, block size 16, at most 8 requests running, so the
later requests find the prefix cached. A random-weight Llama (`build_tiny_model(size="small")`)
in float32 on this machine's CPU (or GPU with --device cuda).

Printed per prefix cache (none, hash_block, radix): mean and p50 TTFT over rounds, the prefix
hit rate in prompt tokens, the prefill tokens computed, and TTFT relative to `none` measured
in the same round. Greedy outputs are checked to agree across caches.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CACHES = ("none", "hash_block", "radix")


def workload(n: int, prefix_len: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(2, 500) for _ in range(prefix_len)]
    return [prefix + [rng.randrange(2, 500) for _ in range(rng.randint(16, 48))] for _ in range(n)]


def run_once(model: str, cache: str, prompts: list[list[int]], args) -> dict:
    from schedlab import LLM, SamplingParams

    llm = LLM(model, prefix_cache=cache, block_size=16, max_num_seqs=args.max_num_seqs,
              max_model_len=1024, num_kv_blocks=512, device=args.device)
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    outs = llm.generate(prompts, sp)
    ttft = [o.metrics.first_token_time - o.metrics.arrival_time for o in outs]
    eng = llm.engine
    c = eng.counters()
    return dict(
        ttft=ttft,
        hit_rate=c.num_prefix_hit_tokens / max(c.num_prefix_query_tokens, 1),
        prefill_tokens=sum(s.num_prefill_tokens for s in eng.step_stats),
        tokens=[o.outputs[0].token_ids for o in outs],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prefix-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--size", default="small")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    from schedlab.tiny import build_tiny_model

    model = str(build_tiny_model(family="llama", size=args.size, max_position_embeddings=1024))
    prompts = workload(args.requests, args.prefix_len)
    run_once(model, "none", prompts[:2], args)  # warm-up: first-call costs out of the rounds
    results: dict[str, list[dict]] = {c: [] for c in CACHES}
    ratios: dict[str, list[float]] = {c: [] for c in CACHES}
    for r in range(args.rounds):
        order = CACHES[r % len(CACHES):] + CACHES[: r % len(CACHES)]  # rotate against drift
        got = {c: run_once(model, c, prompts, args) for c in order}
        base = statistics.mean(got["none"]["ttft"])
        for c in CACHES:
            results[c].append(got[c])
            ratios[c].append(statistics.mean(got[c]["ttft"]) / base)
            assert got[c]["tokens"] == got["none"]["tokens"], f"{c} changed the greedy output"

    print(f"{args.requests} requests, shared prefix {args.prefix_len} tokens, "
          f"{args.rounds} rounds, model llama-{args.size}, device {args.device}")
    print(f"{'cache':<11} {'mean TTFT ms':>12} {'p50 TTFT ms':>11} {'vs none':>8} "
          f"{'hit rate':>8} {'prefill tok':>11}")
    for c in CACHES:
        all_ttft = [t for res in results[c] for t in res["ttft"]]
        print(f"{c:<11} {statistics.mean(all_ttft) * 1e3:>12.1f} "
              f"{statistics.median(all_ttft) * 1e3:>11.1f} {statistics.median(ratios[c]):>8.2f} "
              f"{results[c][-1]['hit_rate']:>8.2f} {results[c][-1]['prefill_tokens']:>11}")


if __name__ == "__main__":
    main()
