"""Operator profiles as CSV: one row per operator and shape, and the fit of each operator.

The format (`schedlab calibrate --operators FILE`; written by `--measure-operators FILE`):

    operator,num_tokens,num_seqs,context_len,k,n,time_us
    gemm,128,1,0,4096,6144,1893.0
    attention_prefill,512,1,0,,,2210.5
    attention_decode,1,32,512,,,410.2
    kv_write,256,1,0,,,35.1
    elementwise,256,1,0,,,180.4
    lm_head,8,1,0,,,5100.0
    sampling,8,1,0,,,310.0

- `operator`: one of `schedlab.sim.operators.OPERATORS`.
- `num_tokens`: the rows M of a `gemm` / `lm_head`, the query tokens of each sequence of an
  `attention_prefill`, the new tokens of a `kv_write` / `elementwise`, the sampled rows of
  `sampling` (1 for `attention_decode`).
- `num_seqs`: sequences of an attention call (1 elsewhere; blank reads as 1).
- `context_len`: tokens cached before each sequence's new ones (attention; blank: 0).
- `k`, `n`: the GEMM's weight shape [k, n] (`gemm` only; `lm_head` is [hidden, vocab]).
- `time_us`: microseconds of ONE call: one layer for the per-layer operators, one step for
  `lm_head` and `sampling`.

Lines starting with `#` and columns not listed are ignored, so another profiler's CSV needs
only an adapter that renames its columns and operators. Shapes are those of the model the
profile is fitted for (heads, head dim and KV width come from its `ModelSpec`).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from schedlab.calibration.costfit import FitResult, fit_params
from schedlab.shapes import ModelSpec
from schedlab.sim import operators as op
from schedlab.sim.costmodel import CostModel
from schedlab.sim.hardware import HardwareProfile

COLUMNS = ("operator", "num_tokens", "num_seqs", "context_len", "k", "n", "time_us")
#: which profile fields each group of operators fits, in order (later groups keep the
#: earlier groups' fitted values: the memory efficiency of the GEMMs, say)
GROUPS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("gemm", "lm_head"), ("linear_efficiency", "memory_efficiency", "kernel_time")),
    (("attention_prefill", "attention_decode"), ("attention_efficiency", "kv_efficiency")),
    (("kv_write", "elementwise", "sampling"), ("kv_write_efficiency", "elementwise_efficiency")),
)


@dataclass(frozen=True, slots=True)
class OperatorTime:
    """One row of an operator profile (see the module docstring for each field)."""

    operator: str
    num_tokens: int
    time_s: float
    num_seqs: int = 1
    context_len: int = 0
    k: int = 0
    n: int = 0


def read_profile(path: str | Path) -> list[OperatorTime]:
    """Rows of an operator-profile CSV.

    Raises:
        ValueError: a missing column, an unknown operator or a bad number, naming the line.
    """
    lines = [ln for ln in Path(path).read_text().splitlines() if not ln.lstrip().startswith("#")]
    reader = csv.DictReader(lines)
    missing = [c for c in ("operator", "num_tokens", "time_us") if c not in (reader.fieldnames
                                                                           or ())]
    if missing:
        raise ValueError(f"{path}: no column {', '.join(missing)}; columns: {', '.join(COLUMNS)}")
    rows = []
    for i, rec in enumerate(reader, start=2):
        name = (rec.get("operator") or "").strip()
        if name not in op.OPERATORS:
            raise ValueError(f"{path} line {i}: operator={name!r}; accepted: "
                             f"{', '.join(op.OPERATORS)}")
        try:
            ints = {c: int(float(rec.get(c) or d)) for c, d in
                    (("num_tokens", 0), ("num_seqs", 1), ("context_len", 0), ("k", 0), ("n", 0))}
            t = float(rec["time_us"]) * 1e-6
        except (TypeError, ValueError):
            raise ValueError(f"{path} line {i}: a number is expected in every column of "
                             f"{', '.join(COLUMNS[1:])} (blank: default)") from None
        if name == "gemm" and not (ints["k"] and ints["n"]):
            raise ValueError(f"{path} line {i}: a gemm row needs k and n")
        if t <= 0:
            raise ValueError(f"{path} line {i}: time_us must be positive")
        rows.append(OperatorTime(name, time_s=t, **ints))
    return rows


def write_profile(path: str | Path, rows: Iterable[OperatorTime]) -> Path:
    """Write rows in the format `read_profile` reads."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([r.operator, r.num_tokens, r.num_seqs, r.context_len, r.k or "",
                        r.n or "", f"{r.time_s * 1e6:.3f}"])
    return p


def predict(model: CostModel, r: OperatorTime) -> float:
    """The cost model's time of one call of the row's operator."""
    hw, spec, b = model.hw, model.spec, model.dtype_bytes
    kvb, heads, d = model.kv_bytes_per_token_layer, model.heads, spec.head_dim
    if r.operator == "gemm":
        return op.gemm_time(hw, r.num_tokens, r.k, r.n, b)
    if r.operator == "lm_head":
        return op.lm_head_time(hw, r.num_tokens, spec.hidden_size, spec.vocab_size // model.tp, b)
    if r.operator == "attention_prefill":
        q, c = r.num_tokens, r.context_len
        pairs = r.num_seqs * (q * c + q * (q + 1) // 2)
        return op.attention_prefill_time(hw, pairs, r.num_seqs * (q + c), heads, d, kvb)
    if r.operator == "attention_decode":
        return op.attention_decode_time(hw, r.num_seqs * (r.context_len + 1), heads, d, kvb)
    if r.operator == "kv_write":
        return op.kv_write_time(hw, r.num_tokens, kvb)
    if r.operator == "elementwise":
        return op.elementwise_time(hw, r.num_tokens, model.elementwise_bytes_per_token)
    return op.sampling_time(hw, r.num_tokens, spec.vocab_size)


@dataclass(frozen=True, slots=True)
class OperatorFit:
    """A profile fitted to operator times, and each operator's relative errors."""

    profile: HardwareProfile
    errors: dict[str, FitResult]

    def summary(self) -> list[str]:
        """One line per operator: rows, fitted and held-out mean |error|."""
        out = []
        for name, res in self.errors.items():
            held = res.held_out_error
            out.append(f"{name:<18} {len(res.rel_errors):>4} shapes  fit {res.mean_abs_error:6.1%}"
                       + ("" if held is None else f"  held out ({len(res.held_out)}) {held:6.1%}"))
        return out


def fit_operators(spec: ModelSpec, base: HardwareProfile, rows: Sequence[OperatorTime],
                  dtype_bytes: int = 2, hold_out: int = 4) -> OperatorFit:
    """Fit each group of operators' parameters (`GROUPS`) of `base` to the profiled `rows`,
    leaving every `hold_out`-th shape of each operator out of the fit (0 or 1: none).

    Raises:
        ValueError: no rows at all.
    """
    if not rows:
        raise ValueError("the operator profile has no rows")
    prof = base
    errors: dict[str, FitResult] = {}
    for names, params in GROUPS:
        sel = [r for r in rows if r.operator in names]
        if not sel:
            continue
        fit_rows, seen = [], {n: 0 for n in names}
        for i, r in enumerate(sel):
            if hold_out < 2 or seen[r.operator] % hold_out != hold_out - 1:
                fit_rows.append(i)
            seen[r.operator] += 1

        def times(p: HardwareProfile, sel=sel) -> np.ndarray:
            model = CostModel(spec, p, dtype_bytes)
            return np.array([predict(model, r) for r in sel])

        res = fit_params(times, prof, params, [r.time_s for r in sel], fit_rows)
        prof = res.profile
        for name in names:
            idx = [i for i, r in enumerate(sel) if r.operator == name]
            if idx:
                errors[name] = FitResult(prof, tuple(res.rel_errors[i] for i in idx),
                                         tuple(j for j, i in enumerate(idx) if i in res.held_out))
    return OperatorFit(prof, errors)
