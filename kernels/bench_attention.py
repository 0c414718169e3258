"""Check the paged-attention kernels against their references, then time them against SDPA.

    python -m schedlab.kernels.bench_attention            # on a CUDA GPU: a couple of minutes
    python -m schedlab.kernels.bench_attention --dtypes bf16 --max-tokens 1048576

On a GPU: every kernel is compared with its `*_ref` twin on random inputs (bf16 and fp16),
then decode and prefill are timed with `triton.testing.do_bench` against
`torch.nn.functional.scaled_dot_product_attention` over the same K/V already gathered into
dense `[B, H_kv, L, D]` tensors (the gather is not timed: SDPA gets its best case). Printed as
markdown tables: time, achieved K/V bandwidth (bytes of K and V read / time) and SDPA's time
over ours (> 1: the kernel is faster). Without a GPU it runs a tiny interpreter smoke check
instead and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
BATCHES = (1, 4, 16, 64, 256)
CONTEXTS = (128, 1024, 4096, 16384, 32768)
PREFILL = ((1, 512, 512), (1, 2048, 2048), (4, 2048, 2048), (1, 8192, 8192), (8, 512, 4096),
           (1, 512, 32768))  # (batch, chunk length, context length)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def paged_inputs(batch: int, ctx: int, num_kv_heads: int, head_dim: int, block_size: int,
                 dtype: torch.dtype, device: torch.device):
    """Random caches holding `batch` contexts of `ctx` tokens in randomly permuted blocks."""
    per_seq = -(-ctx // block_size)
    shape = (batch * per_seq, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, dtype=dtype, device=device)
    v_cache = torch.randn(shape, dtype=dtype, device=device)
    perm = torch.randperm(batch * per_seq, device=device)
    tables = perm.view(batch, per_seq).to(torch.int32)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    return k_cache, v_cache, tables, seq_lens


def gathered(cache: torch.Tensor, tables: torch.Tensor, ctx: int) -> torch.Tensor:
    """`[B, H_kv, ctx, D]` dense copy of each sequence's cached tokens."""
    return cache[tables.long()].flatten(1, 2)[:, :ctx].transpose(1, 2).contiguous()


def timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """Milliseconds per call: do_bench's median on a GPU, one wall-clock run elsewhere."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=10, rep=40, return_mode="median")

    def once(fn):
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    return once


def check_kernels(device: torch.device, dtypes: list[torch.dtype], tiny: bool) -> bool:
    """Compare every kernel with its reference on random inputs; print one line each."""
    from schedlab.kernels.decode_attention import paged_decode, paged_decode_ref
    from schedlab.kernels.prefill_attention import paged_prefill, paged_prefill_ref
    from schedlab.kernels.store_kv import store_kv, store_kv_ref

    heads, kv_heads, head_dim = (4, 2, 64) if tiny else (HEADS, KV_HEADS, HEAD_DIM)
    lens = [1, 37, 70] if tiny else [1, 100, 1000, 5000]
    ok = True
    for dtype in dtypes:
        tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
        batch, ctx, bs = len(lens), max(lens), 16
        k_cache, v_cache, tables, _ = paged_inputs(batch, ctx, kv_heads, head_dim, bs, dtype,
                                                   device)
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
        scale = head_dim ** -0.5
        results = {}

        new_k = torch.randn(sum(lens), kv_heads, head_dim, dtype=dtype, device=device)
        new_v = torch.randn_like(new_k)
        slots = torch.randperm(k_cache.shape[0] * bs, device=device)[: sum(lens)]
        kc, vc, kr, vr = k_cache.clone(), v_cache.clone(), k_cache.clone(), v_cache.clone()
        store_kv(new_k, new_v, kc, vc, slots)
        store_kv_ref(new_k, new_v, kr, vr, slots)
        results["store_kv"] = max((kc - kr).abs().max().item(), (vc - vr).abs().max().item())

        q = torch.randn(batch, heads, head_dim, dtype=dtype, device=device)
        ref = paged_decode_ref(q, k_cache, v_cache, tables, seq_lens, scale).float()
        for splits in (1, 4):
            out = torch.full_like(q, float("nan"))
            paged_decode(q, k_cache, v_cache, tables, seq_lens, scale, ctx, out=out,
                         num_splits=splits)
            results[f"paged_decode splits={splits}"] = (out.float() - ref).abs().max().item()

        q_lens = [min(n, 5 if tiny else 300) for n in lens]
        qsl = torch.tensor([0, *q_lens], device=device).cumsum(0).to(torch.int32)
        qp = torch.randn(sum(q_lens), heads, head_dim, dtype=dtype, device=device)
        ref = paged_prefill_ref(qp, k_cache, v_cache, tables, seq_lens, qsl, scale).float()
        out = torch.full_like(qp, float("nan"))
        paged_prefill(qp, k_cache, v_cache, tables, seq_lens, qsl, scale, max(q_lens), out=out)
        results["paged_prefill"] = (out.float() - ref).abs().max().item()

        for name, err in results.items():
            good = err <= tol  # NaN (an unwritten element) fails too
            ok &= good
            print(f"check {name:<24} {str(dtype):<15} max|err| {err:.2e}  "
                  f"{'ok' if good else 'FAIL'}")
    return ok


def _time_decode(ms, batch: int, ctx: int, dtype: torch.dtype, device: torch.device):
    from schedlab.kernels.decode_attention import paged_decode

    k_cache, v_cache, tables, seq_lens = paged_inputs(
        batch, ctx, KV_HEADS, HEAD_DIM, BLOCK_SIZE, dtype, device)
    q = torch.randn(batch, HEADS, HEAD_DIM, dtype=dtype, device=device)
    out = torch.empty_like(q)
    scale = HEAD_DIM ** -0.5
    t_tri = ms(lambda: paged_decode(q, k_cache, v_cache, tables, seq_lens, scale, ctx, out=out))
    k, v = gathered(k_cache, tables, ctx), gathered(v_cache, tables, ctx)
    q4 = q[:, :, None]
    t_sdpa = ms(lambda: F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True))
    return t_tri, t_sdpa


def _time_prefill(ms, batch: int, chunk: int, ctx: int, dtype: torch.dtype,
                  device: torch.device):
    from torch.nn.attention.bias import causal_lower_right

    from schedlab.kernels.prefill_attention import paged_prefill

    k_cache, v_cache, tables, seq_lens = paged_inputs(
        batch, ctx, KV_HEADS, HEAD_DIM, BLOCK_SIZE, dtype, device)
    q = torch.randn(batch * chunk, HEADS, HEAD_DIM, dtype=dtype, device=device)
    qsl = torch.arange(0, batch * chunk + 1, chunk, dtype=torch.int32, device=device)
    out = torch.empty_like(q)
    scale = HEAD_DIM ** -0.5
    t_tri = ms(lambda: paged_prefill(q, k_cache, v_cache, tables, seq_lens, qsl, scale, chunk,
                                     out=out))
    # NOTE: K/V expanded to every query head: SDPA's kernels for a lower-right causal mask
    # may not take enable_gqa, and prefill is bound by compute, not by reading K/V.
    group = HEADS // KV_HEADS
    k = gathered(k_cache, tables, ctx).repeat_interleave(group, 1)
    v = gathered(v_cache, tables, ctx).repeat_interleave(group, 1)
    q4 = q.view(batch, chunk, HEADS, HEAD_DIM).transpose(1, 2)
    mask = causal_lower_right(chunk, ctx)
    t_sdpa = ms(lambda: F.scaled_dot_product_attention(q4, k, v, attn_mask=mask, scale=scale))
    return t_tri, t_sdpa


def bench_decode(device: torch.device, dtype: torch.dtype, max_tokens: int) -> None:
    from schedlab.kernels.decode_attention import default_num_splits

    ms = timer(device)
    elem = torch.empty((), dtype=dtype).element_size()
    print(f"\n### decode, {dtype}, {HEADS}/{KV_HEADS} heads, head_dim {HEAD_DIM}, "
          f"block_size {BLOCK_SIZE}\n")
    print("| batch | context | splits | triton ms | triton GB/s | SDPA ms | SDPA GB/s "
          "| SDPA ms / triton ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for ctx in CONTEXTS:
        for batch in BATCHES:
            if batch * ctx > max_tokens:
                continue
            t_tri, t_sdpa = _time_decode(ms, batch, ctx, dtype, device)
            gb = 2 * batch * ctx * KV_HEADS * HEAD_DIM * elem / 1e9
            splits = default_num_splits(batch * KV_HEADS, ctx, device)
            print(f"| {batch} | {ctx} | {splits} | {t_tri:.3f} | {gb / t_tri * 1e3:.0f} "
                  f"| {t_sdpa:.3f} | {gb / t_sdpa * 1e3:.0f} | {t_sdpa / t_tri:.2f} |")


#: split counts and small batches `--sweep-splits` times (the shapes where the choice matters)
SWEEP_SPLITS = (1, 2, 4, 8, 16, 32, 64, 128)
SWEEP_BATCHES = (1, 2, 4, 8, 16, 32, 48, 64)  # up to where the rule stops splitting
#: tile choices `--sweep-prefill` times: (block_m, block_n, num_warps, num_stages)
SWEEP_TILES = ((64, 64, None, None), (64, 64, 4, 3), (128, 64, 8, 3), (128, 32, 4, 2),
               (128, 128, 8, 2), (64, 32, 4, 4))


def sweep_splits(device: torch.device, dtype: torch.dtype, max_tokens: int) -> None:
    """Decode time at every split count for small batches: the best against the default."""
    from schedlab.kernels.decode_attention import default_num_splits, paged_decode

    ms = timer(device)
    print(f"\n### decode split-K sweep, {dtype} (ms at each split count; * = default)\n")
    print("| batch | context | " + " | ".join(str(n) for n in SWEEP_SPLITS)
          + " | best | default | default / best |")
    print("|---:|---:|" + "---:|" * (len(SWEEP_SPLITS) + 3))
    for ctx in CONTEXTS:
        for batch in SWEEP_BATCHES:
            if batch * ctx > max_tokens:
                continue
            k_cache, v_cache, tables, seq_lens = paged_inputs(
                batch, ctx, KV_HEADS, HEAD_DIM, BLOCK_SIZE, dtype, device)
            q = torch.randn(batch, HEADS, HEAD_DIM, dtype=dtype, device=device)
            out = torch.empty_like(q)
            scale = HEAD_DIM ** -0.5
            run = partial(paged_decode, q, k_cache, v_cache, tables, seq_lens, scale, ctx,
                          out=out)
            times = {n: ms(partial(run, num_splits=n)) for n in SWEEP_SPLITS}
            default = default_num_splits(batch * KV_HEADS, ctx, device)
            t_def = ms(run)
            best = min(times, key=times.__getitem__)
            cells = " | ".join(f"{times[n]:.3f}" for n in SWEEP_SPLITS)
            print(f"| {batch} | {ctx} | {cells} | {best} | {default}* {t_def:.3f} "
                  f"| {t_def / times[best]:.2f} |")


def sweep_prefill(device: torch.device, dtype: torch.dtype, max_tokens: int) -> None:
    """Prefill time for each tile choice of `SWEEP_TILES`, against SDPA."""
    from schedlab.kernels.prefill_attention import PrefillTiles, paged_prefill

    ms = timer(device)
    print(f"\n### prefill tile sweep, {dtype} (SDPA ms / triton ms for each tile choice)\n")
    names = [f"m{m} n{n} w{w or '-'} s{st or '-'}" for m, n, w, st in SWEEP_TILES]
    print("| batch | chunk | context | " + " | ".join(names) + " |")
    print("|---:|---:|---:|" + "---:|" * len(names))
    for batch, chunk, ctx in PREFILL:
        if batch * ctx > max_tokens:
            continue
        _, t_sdpa = _time_prefill(ms, batch, chunk, ctx, dtype, device)
        k_cache, v_cache, tables, seq_lens = paged_inputs(
            batch, ctx, KV_HEADS, HEAD_DIM, BLOCK_SIZE, dtype, device)
        q = torch.randn(batch * chunk, HEADS, HEAD_DIM, dtype=dtype, device=device)
        qsl = torch.arange(0, batch * chunk + 1, chunk, dtype=torch.int32, device=device)
        out = torch.empty_like(q)
        cells = []
        run = partial(paged_prefill, q, k_cache, v_cache, tables, seq_lens, qsl,
                      HEAD_DIM ** -0.5, chunk, out=out)
        for m, n, w, st in SWEEP_TILES:
            try:
                t = ms(partial(run, tiles=PrefillTiles(m, n, w, st)))
                cells.append(f"{t_sdpa / t:.2f}")
            except Exception as e:  # e.g. out of shared memory for this tile choice
                cells.append(type(e).__name__)
        print(f"| {batch} | {chunk} | {ctx} | " + " | ".join(cells) + " |")


def bench_prefill(device: torch.device, dtype: torch.dtype, max_tokens: int) -> None:
    ms = timer(device)
    elem = torch.empty((), dtype=dtype).element_size()
    print(f"\n### prefill (a chunk of new tokens at the end of its context), {dtype}\n")
    print("| batch | chunk | context | triton ms | triton TFLOP/s | triton GB/s | SDPA ms "
          "| SDPA ms / triton ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for batch, chunk, ctx in PREFILL:
        if batch * ctx > max_tokens:
            continue
        t_tri, t_sdpa = _time_prefill(ms, batch, chunk, ctx, dtype, device)
        # causal pairs: each query sees its earlier context plus its part of the chunk
        pairs = batch * HEADS * (chunk * (ctx - chunk) + chunk * (chunk + 1) / 2)
        tflops = 4 * pairs * HEAD_DIM / (t_tri * 1e-3) / 1e12
        gb = 2 * batch * ctx * KV_HEADS * HEAD_DIM * elem / 1e9
        print(f"| {batch} | {chunk} | {ctx} | {t_tri:.3f} | {tflops:.1f} | "
              f"{gb / t_tri * 1e3:.0f} | {t_sdpa:.3f} | {t_sdpa / t_tri:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="bf16,fp16", help="comma-separated: bf16, fp16")
    parser.add_argument("--max-tokens", type=int, default=1 << 21,
                        help="skip shapes whose batch x context exceeds this (memory, time)")
    parser.add_argument("--skip-prefill", action="store_true")
    parser.add_argument("--sweep-splits", action="store_true",
                        help="also time every decode split count at small batches")
    parser.add_argument("--sweep-prefill", action="store_true",
                        help="also time the prefill tile choices against SDPA")
    args = parser.parse_args(argv)
    dtypes = [DTYPES[d.strip()] for d in args.dtypes.split(",")]

    if not torch.cuda.is_available():
        # NOTE: must precede the first kernel import, which happens inside the functions.
        os.environ["TRITON_INTERPRET"] = "1"
        print("No CUDA device: the benchmark needs a GPU. Running a tiny correctness smoke "
              "check in the Triton interpreter instead (no timings).")
        ok = check_kernels(torch.device("cpu"), [torch.float16], tiny=True)
        print("smoke check passed" if ok else "smoke check FAILED")
        return 0 if ok else 1

    device = torch.device("cuda")
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name(device)}; torch {torch.__version__}")
    if not check_kernels(device, dtypes, tiny=False):
        print("kernel checks FAILED; timings skipped")
        return 1
    for dtype in dtypes:
        bench_decode(device, dtype, args.max_tokens)
        if args.sweep_splits:
            sweep_splits(device, dtype, args.max_tokens)
        if not args.skip_prefill:
            bench_prefill(device, dtype, args.max_tokens)
        if args.sweep_prefill:
            sweep_prefill(device, dtype, args.max_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
