"""Fitting the cost model to measured step times: efficiencies and overheads by least squares.

Each roofline term is max(compute, memory); once it is known which side binds, a step's time is
linear in the inverse efficiencies and the overheads, so binding sides and parameters are
refined in turn (non-negative least squares, numpy only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from schedlab.shapes import ModelSpec
from schedlab.sim.costmodel import CostModel, RawTerms, StepShape
from schedlab.sim.hardware import HardwareProfile

#: fitted parameters: four efficiencies (their inverses are linear) and three overheads
PARAMS = ("linear_efficiency", "attention_efficiency", "memory_efficiency", "kv_efficiency",
          "step_overhead", "seq_overhead", "prefill_overhead")
_NUM_EFF = 4


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson-Hanson active set)."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    for _ in range(max_iter):
        w = a.T @ (b - a @ x)
        if passive.all() or w[~passive].max(initial=-np.inf) <= 1e-12 * (abs(w).max() + 1):
            break
        j = np.argmax(np.where(passive, -np.inf, w))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
    return x


@dataclass(frozen=True, slots=True)
class FitResult:
    """A fitted profile and its relative errors on the fitting data."""

    profile: HardwareProfile
    rel_errors: tuple[float, ...]

    @property
    def mean_abs_error(self) -> float:
        return float(np.mean(np.abs(self.rel_errors)))


def fit_profile(spec: ModelSpec, base: HardwareProfile, shapes: Sequence[StepShape],
                times: Sequence[float], block_size: int, dtype_bytes: int = 4,
                tp: int = 1) -> FitResult:
    """Fit efficiencies and overheads of `base` so the cost model predicts `times`, measured
    with KV blocks of `block_size` tokens.

    Each roofline term is max(compute, memory); given which side binds, the step time is
    linear in the inverse efficiencies and the overheads. Binding sides and parameters are
    refined alternately from several starting points; rows are weighted by 1/time (relative
    error), and the best fit wins.
    """
    t = np.asarray(times, dtype=float)
    raw = [CostModel(spec, base, dtype_bytes, tp).raw_terms(s, block_size) for s in shapes]
    fixed = np.array([r.allreduce / base.interconnect_efficiency + r.swap for r in raw])
    best: FitResult | None = None
    for start in ((1, 1, 1, 1), (10, 10, 1, 1), (1, 10, 10, 10), (10, 1, 10, 1), (3, 3, 3, 3)):
        inv = np.array(start, dtype=float)
        x = np.zeros(len(PARAMS))
        for _ in range(30):
            a = np.array([_row(s, r, inv) for s, r in zip(shapes, raw, strict=True)]) / t[:, None]
            x = nnls(a, (t - fixed) / t)
            used = np.abs(a[:, :_NUM_EFF]).sum(axis=0) > 0
            new_inv = np.where(used & (x[:_NUM_EFF] > 0), x[:_NUM_EFF], inv)
            done = np.allclose(new_inv, inv, rtol=1e-6)
            inv = new_inv
            if done:
                break
        fitted = dict(zip(PARAMS, [*(1 / inv), *x[_NUM_EFF:]], strict=True))
        prof = replace(base, **{k: float(v) for k, v in fitted.items()})
        model = CostModel(spec, prof, dtype_bytes, tp)
        pred = np.array([model.step_time(s, block_size) for s in shapes])
        res = FitResult(prof, tuple(float(e) for e in (pred - t) / t))
        if best is None or res.mean_abs_error < best.mean_abs_error:
            best = res
    assert best is not None
    return best


def _row(shape: StepShape, r: RawTerms, inv: np.ndarray) -> np.ndarray:
    """One design-matrix row: each term's binding side goes to its efficiency's column."""
    row = np.zeros(len(PARAMS))
    for comp, mem, ci, mi in ((r.linear_compute, r.linear_memory, 0, 2),
                              (r.attention_compute, r.attention_memory, 1, 3),
                              (r.logits_compute, r.logits_memory, 0, 2)):
        if comp * inv[ci] >= mem * inv[mi]:
            row[ci] += comp
        else:
            row[mi] += mem
    row[_NUM_EFF:] = (1.0, shape.num_seqs, shape.num_prefills)
    return row
