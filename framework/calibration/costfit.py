"""Fitting the cost model to measured times: efficiencies and overheads by least squares.

A predicted time is piecewise linear or smooth in the fitted parameters (the inverse
efficiencies and the overheads in seconds: every operator is a max or p-norm of terms each
linear in one of them). The fit is Gauss-Newton under bounds: the gradient at the current
parameters linearizes every time, non-negative least squares (numpy only) solves for the next
parameters, from several starts; the best fit in relative error wins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from schedlab.shapes import ModelSpec
from schedlab.sim.costmodel import CostModel, StepShape
from schedlab.sim.hardware import HardwareProfile

#: efficiencies a fit may change (the inverse of each is what the times are linear in)
EFFICIENCIES = ("linear_efficiency", "attention_efficiency", "memory_efficiency",
                "kv_efficiency", "kv_write_efficiency", "elementwise_efficiency")
#: seconds a fit may change
SECONDS = ("kernel_time", "launch_overhead", "step_overhead", "seq_overhead",
           "prefill_overhead")
#: what a whole-step fit changes. The KV write and the elementwise kernels grow with the
#: tokens as the GEMMs do, and an eager step's launches are as constant as its fixed overhead,
#: so step times cannot tell them apart: operator profiles fit those (`fit_operators`)
PARAMS = ("linear_efficiency", "attention_efficiency", "memory_efficiency", "kv_efficiency",
          "step_overhead", "seq_overhead", "prefill_overhead")


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
    """A fitted profile and its relative errors: on the fitting data, and on the held-out
    entries (`held_out`: their indices) when some were left out of the fit."""

    profile: HardwareProfile
    rel_errors: tuple[float, ...]
    held_out: tuple[int, ...] = ()

    @property
    def mean_abs_error(self) -> float:
        fitted = [e for i, e in enumerate(self.rel_errors) if i not in self.held_out]
        return float(np.mean(np.abs(fitted))) if fitted else 0.0

    @property
    def held_out_error(self) -> float | None:
        """Mean |relative error| on the held-out entries (None: none were held out)."""
        if not self.held_out:
            return None
        return float(np.mean(np.abs([self.rel_errors[i] for i in self.held_out])))


def _vector(profile: HardwareProfile, params: Sequence[str]) -> np.ndarray:
    return np.array([1.0 / getattr(profile, k) if k in EFFICIENCIES else getattr(profile, k)
                     for k in params], dtype=float)


def _profile(base: HardwareProfile, params: Sequence[str], x: np.ndarray) -> HardwareProfile:
    vals: dict[str, Any] = {k: float(1.0 / v if k in EFFICIENCIES else v)
                            for k, v in zip(params, x, strict=True)}
    return replace(base, **vals)


def fit_params(predict: Callable[[HardwareProfile], np.ndarray], base: HardwareProfile,
               params: Sequence[str], times: Sequence[float],
               fit_rows: Sequence[int] | None = None, iterations: int = 30) -> FitResult:
    """Fit `params` of `base` so `predict(profile)` (one time per entry, degree one in the
    parameters plus a part they do not touch) matches `times` in relative error.

    Rows outside `fit_rows` (all when None) are held out: predicted, not fitted. The best of
    several starts (inverse efficiencies 1, 3, 10; seconds from zero) wins.
    """
    t = np.asarray(times, dtype=float)
    rows = np.arange(len(t)) if fit_rows is None else np.asarray(sorted(fit_rows), dtype=int)
    held = tuple(i for i in range(len(t)) if i not in set(rows.tolist()))
    n_eff = sum(k in EFFICIENCIES for k in params)
    zero = _vector(base, params)
    zero[n_eff:] = 0.0
    best: FitResult | None = None
    for start in ((1.0,) * n_eff, (3.0,) * n_eff, (10.0,) * n_eff,
                  tuple(10.0 if i % 2 else 1.0 for i in range(n_eff))):
        x = zero.copy()
        x[:n_eff] = start
        for _ in range(iterations):
            p0 = predict(_profile(base, params, x))
            jac = np.empty((len(t), len(params)))
            for j in range(len(params)):
                h = max(abs(x[j]) * 1e-4, 1e-9)
                xj = x.copy()
                xj[j] += h
                jac[:, j] = (predict(_profile(base, params, xj)) - p0) / h
            # p0 - jac @ x: the part of each time the parameters do not scale (all-reduce,
            # swaps, the launch time the device does not hide)
            a = jac[rows] / t[rows, None]
            new = nnls(a, (t[rows] - (p0 - jac @ x)[rows]) / t[rows])
            used = np.abs(a).sum(axis=0) > 0
            new = np.where(used, new, x)
            new[:n_eff] = np.maximum(new[:n_eff], 1e-3)  # an efficiency stays finite
            done = np.allclose(new, x, rtol=1e-6, atol=1e-12)
            x = new
            if done:
                break
        prof = _profile(base, params, x)
        pred = predict(prof)
        res = FitResult(prof, tuple(float(e) for e in (pred - t) / t), held)
        if best is None or res.mean_abs_error < best.mean_abs_error:
            best = res
    assert best is not None
    return best


def fit_profile(spec: ModelSpec, base: HardwareProfile, shapes: Sequence[StepShape],
                times: Sequence[float], block_size: int, dtype_bytes: int = 4,
                tp: int = 1, hold_out: int = 0) -> FitResult:
    """Fit the efficiencies and overheads of `base` (`PARAMS`) so the cost model predicts the
    step `times` measured for `shapes` with KV blocks of `block_size` tokens (eager steps).

    `hold_out=k` leaves every k-th shape out of the fit (k >= 2) and reports its error
    (`FitResult.held_out_error`).
    """
    def predict(prof: HardwareProfile) -> np.ndarray:
        model = CostModel(spec, prof, dtype_bytes, tp)
        return np.array([model.step_time(s, block_size) for s in shapes])

    rows = None if hold_out < 2 else [i for i in range(len(shapes)) if i % hold_out]
    return fit_params(predict, base, PARAMS, times, rows)
