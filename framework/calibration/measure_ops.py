"""Timing each operator of a model's layer with torch, for an operator profile (CSV).

The torch ops the engine's forward runs, at the model's shapes, on `device`: the four
GEMMs of a layer, SDPA attention over prefill chunks and decode batches, the KV-cache write
(`index_copy_` into the cache, as the sdpa backend stores K/V), one layer's elementwise ops
(RMSNorms, RoPE, SiLU-and-mul, residual adds), the LM head and greedy sampling. Each shape's
median of `repeats` timed calls is one row (`profile_csv.OperatorTime`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from schedlab.calibration.profile_csv import OperatorTime
from schedlab.shapes import ModelSpec

TOKENS = (1, 8, 32, 64, 128, 256, 512)
DECODES = ((1, 128), (8, 128), (8, 512), (32, 256), (32, 512))
PREFILLS = ((32, 0), (128, 0), (256, 0), (512, 0), (128, 256))


def _median_time(fn: Callable[[], object], repeats: int, sync: Callable[[], object]) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_operators(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
                      repeats: int = 5, max_tokens: int = 512) -> list[OperatorTime]:
    """One row per operator and shape, for `spec` in `dtype` on `device`."""
    import torch
    import torch.nn.functional as F

    from schedlab.model import resolve_dtype

    dt, dev = resolve_dtype(dtype), torch.device(device)
    sync: Callable[[], object] = torch.cuda.synchronize if dev.type == "cuda" else _nothing
    h, d, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
    nh, nkv = spec.num_heads, spec.num_kv_heads
    gemms = ((h, d * (nh + 2 * nkv)), (d * nh, h), (h, 2 * inter), (inter, h))
    weights = [torch.randn(k, n, dtype=dt, device=dev) * 0.02 for k, n in gemms]
    rows: list[OperatorTime] = []

    def add(name: str, fn: Callable[[], object], tokens: int, **kw: int) -> None:
        rows.append(OperatorTime(name, tokens, _median_time(fn, repeats, sync), **kw))

    tokens = [t for t in TOKENS if t <= max_tokens]
    for m in tokens:
        xs = {k: torch.randn(m, k, dtype=dt, device=dev) for k in {k for k, _ in gemms}}
        for (k, n), w in zip(gemms, weights, strict=True):
            add("gemm", _call(torch.matmul, xs[k], w), m, k=k, n=n)
    for q, c in PREFILLS:
        if q + c > max_tokens:
            continue
        qt = torch.randn(1, nh, q, d, dtype=dt, device=dev)
        kt = torch.randn(1, nh, q + c, d, dtype=dt, device=dev)
        mask = None if not c else torch.ones(q, q + c, dtype=torch.bool, device=dev).tril(c)
        add("attention_prefill", _call(_prefill_attention, qt, kt, mask), q, context_len=c)
    for b, c in DECODES:
        qt = torch.randn(b, nh, 1, d, dtype=dt, device=dev)
        kt = torch.randn(b, nh, c + 1, d, dtype=dt, device=dev)
        add("attention_decode", _call(F.scaled_dot_product_attention, qt, kt, kt), 1,
            num_seqs=b, context_len=c)
    cache = torch.zeros(4 * max_tokens, nkv, d, dtype=dt, device=dev)
    norm_w = torch.ones(h, dtype=dt, device=dev)
    for m in tokens:
        kv = torch.randn(m, nkv, d, dtype=dt, device=dev)
        slots = torch.randperm(4 * max_tokens, device=dev)[:m]
        add("kv_write", _call(_write_kv, cache, slots, kv), m)
        x = torch.randn(m, h, dtype=dt, device=dev)
        qk = torch.randn(m, (nh + nkv) * d, dtype=dt, device=dev)
        gu = torch.randn(m, 2 * inter, dtype=dt, device=dev)

        def layer(x=x, qk=qk, gu=gu) -> object:
            for _ in range(2):  # input and post-attention RMSNorm, each + a residual add
                y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_w
                x = x + y
            r = qk * 0.5 + qk.roll(1, -1) * 0.5  # RoPE: two multiplies and an add
            g, u = gu.chunk(2, -1)
            return r, F.silu(g) * u

        add("elementwise", layer, m)
    lm = torch.randn(h, spec.vocab_size, dtype=dt, device=dev) * 0.02
    for m in (t for t in (1, 8, 32) if t <= max_tokens):
        x = torch.randn(m, h, dtype=dt, device=dev)
        add("lm_head", _call(torch.matmul, x, lm), m)
        logits = torch.randn(m, spec.vocab_size, dtype=torch.float32, device=dev)
        add("sampling", _call(_greedy, logits), m)
    return rows


def _nothing() -> None:
    return None


def _call(fn: Callable[..., object], *args: Any) -> Callable[[], object]:
    """`fn` bound to `args`: one timed operator."""
    return lambda: fn(*args)


def _prefill_attention(q: Any, k: Any, mask: Any) -> object:
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, k, attn_mask=mask, is_causal=mask is None)


def _write_kv(cache: Any, slots: Any, kv: Any) -> object:
    """A layer's K and V written into the cache (two scatters)."""
    cache.index_copy_(0, slots, kv)
    return cache.index_copy_(0, slots, kv)


def _greedy(logits: Any) -> object:
    return logits.softmax(-1).argmax(-1)
