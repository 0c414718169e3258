"""Hardware profiles for the cost model: datasheet presets, a CPU probe, JSON save/load.

A profile holds the peaks of one device (matmul FLOP/s, memory bandwidth, capacity, link
bandwidth), the fractions of them each operator reaches (efficiency factors), the shape
effects of GEMMs (tiles, the ridge), kernel and launch times, and fixed per-step host costs.
GPU presets use datasheet figures (dense bf16) and the defaults below (see
`framework/sim/ASSUMPTIONS.md` for where each comes from); `cpu` is measured on the spot.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

GB = 1e9
TB = 1e12
#: the profile's fields that are not numbers
_TEXT_FIELDS = ("name", "dtype", "device")


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """One accelerator as the cost model sees it (all figures per device).

    Args:
        name: a label for reports.
        matmul_flops: peak dense matmul FLOP/s at `dtype`.
        mem_bandwidth: peak memory bandwidth (bytes/s).
        memory_capacity: device memory (bytes).
        interconnect_bandwidth: per-direction device-to-device bandwidth (bytes/s) for TP.
        host_bandwidth: device <-> host bandwidth (bytes/s), for swapped KV blocks.
        dtype: the serving dtype the peaks refer to (weights and KV cache).
        device: "cuda" or "cpu" (a cpu profile leaves KV sizing to the engine's default).
        linear_efficiency: fraction of `matmul_flops` a large GEMM reaches (linear layers
            and logits).
        attention_efficiency: fraction of `matmul_flops` reached by attention.
        memory_efficiency: fraction of `mem_bandwidth` reached when streaming weights (and
            logits when sampling).
        kv_efficiency: fraction of `mem_bandwidth` reached when attention reads the KV cache.
        interconnect_efficiency: fraction of `interconnect_bandwidth` reached by all-reduce.
        step_overhead: fixed host seconds per step outside the forward (input preparation,
            reading the sampled tokens back).
        seq_overhead: seconds per scheduled sequence.
        prefill_overhead: seconds per prefill chunk (sequences running more than one token).
        allreduce_latency: seconds per all-reduce (two per layer when tp > 1).
        gemm_tile_m: GEMM rows per tile: M is rounded up to whole tiles (tile quantization;
            1: none).
        gemm_ridge_sharpness: p of the p-norm joining a GEMM's compute and memory times;
            small near the ridge point means small-M GEMMs well below both bounds, `inf` is
            the plain roofline max.
        kv_write_efficiency: fraction of `mem_bandwidth` the KV-cache write (a scatter of
            small rows into blocks) reaches.
        elementwise_efficiency: fraction of `mem_bandwidth` the elementwise kernels (norms,
            RoPE, activation, residual adds) reach.
        kernel_time: the least device time of one small kernel (seconds).
        launch_overhead: host seconds to launch one kernel in an eager forward; on a GPU a
            step whose launches take longer than its kernels is launch-bound.
        graph_launch_overhead: host seconds to replay one captured CUDA graph (a decode-only
            step when the engine runs graphs).
        decode_pad_waste: the decode padding of the attention backend the profile was
            measured on: decodes read K/V in padded groups that may add up to this fraction
            of their contexts (`schedlab.shapes.padded_decode_groups`, as the sdpa backend
            attends them); None: each decode reads its own context (paged kernels).
    """

    name: str
    matmul_flops: float
    mem_bandwidth: float
    memory_capacity: int
    interconnect_bandwidth: float = 0.0
    host_bandwidth: float = 25 * GB
    dtype: str = "bfloat16"
    device: str = "cuda"
    linear_efficiency: float = 0.7
    attention_efficiency: float = 0.5
    memory_efficiency: float = 0.8
    kv_efficiency: float = 0.7
    interconnect_efficiency: float = 0.7
    step_overhead: float = 1e-3
    seq_overhead: float = 2e-6
    prefill_overhead: float = 1e-5
    allreduce_latency: float = 8e-6
    gemm_tile_m: int = 64
    gemm_ridge_sharpness: float = 2.2
    kv_write_efficiency: float = 0.006
    elementwise_efficiency: float = 0.6
    kernel_time: float = 2e-6
    launch_overhead: float = 5e-6
    graph_launch_overhead: float = 2e-5
    decode_pad_waste: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _TEXT_FIELDS or (f.name == "decode_pad_waste" and v is None):
                continue
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"hardware {f.name}={v!r} must be a number")
            if math.isnan(v) or (math.isinf(v) and f.name != "gemm_ridge_sharpness"):
                raise ValueError(f"hardware {f.name}={v!r} must be a finite number")
        for key in ("matmul_flops", "mem_bandwidth", "memory_capacity", "host_bandwidth"):
            if not getattr(self, key) > 0:
                raise ValueError(f"hardware {key}={getattr(self, key)!r} must be positive")
        for key in ("linear_efficiency", "attention_efficiency", "memory_efficiency",
                    "kv_efficiency", "interconnect_efficiency", "kv_write_efficiency",
                    "elementwise_efficiency", "gemm_ridge_sharpness"):
            v = getattr(self, key)
            if not v > 0:
                raise ValueError(f"hardware {key}={v!r} must be positive (a fraction of peak)")
        for key in ("interconnect_bandwidth", "step_overhead", "seq_overhead",
                    "prefill_overhead", "allreduce_latency", "kernel_time", "launch_overhead",
                    "graph_launch_overhead", "decode_pad_waste"):
            v = getattr(self, key)
            if v is not None and not v >= 0:
                raise ValueError(f"hardware {key}={v!r} must be >= 0 (seconds, bytes/s or a "
                                 "fraction: a negative one would make time run backwards)")
        if not (isinstance(self.gemm_tile_m, int) and self.gemm_tile_m >= 1):
            raise ValueError(f"hardware gemm_tile_m={self.gemm_tile_m!r} must be an integer >= 1")
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"hardware device={self.device!r}; accepted: cuda, cpu")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: str | Path) -> Path:
        """Write the profile as JSON (what `hardware=<path>` loads)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return p

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HardwareProfile:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown hardware fields {unknown}; accepted: {sorted(known)}")
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path) -> HardwareProfile:
        return cls.from_dict(json.loads(Path(path).read_text()))


# Datasheet figures: dense (not sparse) bf16 tensor-core FLOP/s, HBM bandwidth, capacity,
# NVLink bandwidth per direction, PCIe bandwidth per direction.
PRESETS: dict[str, HardwareProfile] = {
    "a100": HardwareProfile("A100-80GB-SXM", matmul_flops=312 * TB, mem_bandwidth=2.039 * TB,
                            memory_capacity=80 * 10**9, interconnect_bandwidth=300 * GB,
                            host_bandwidth=32 * GB),
    "h100": HardwareProfile("H100-SXM", matmul_flops=989 * TB, mem_bandwidth=3.35 * TB,
                            memory_capacity=80 * 10**9, interconnect_bandwidth=450 * GB,
                            host_bandwidth=64 * GB),
    "h200": HardwareProfile("H200-SXM", matmul_flops=989 * TB, mem_bandwidth=4.8 * TB,
                            memory_capacity=141 * 10**9, interconnect_bandwidth=450 * GB,
                            host_bandwidth=64 * GB),
}


def preset_names() -> list[str]:
    return [*PRESETS, "cpu"]


#: the shape and launch terms of a profile nobody has fitted yet: pure roofline, no launches
UNFITTED_SHAPE_TERMS: dict[str, Any] = dict(
    gemm_tile_m=1, gemm_ridge_sharpness=float("inf"), kv_write_efficiency=1.0,
    elementwise_efficiency=1.0, kernel_time=0.0, launch_overhead=0.0, graph_launch_overhead=0.0)


@cache
def probe_cpu(seconds: float = 1.0) -> HardwareProfile:
    """Measure this CPU: float32 matmul FLOP/s and memcpy bandwidth (~`seconds`; the `cpu`
    preset keeps what it measured: `cpu_preset`).

    Efficiency factors stay at 1 and overheads at 0 until `schedlab calibrate` fits them: a
    roofline of the device alone, far below what a real engine's step costs on a CPU (its
    Python and launch overheads).
    """
    import torch

    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    flops = _best_rate(lambda: torch.mm(a, b), 2 * n**3, seconds / 2)
    src = torch.empty(32 << 20, dtype=torch.float32)  # 128 MiB
    src.fill_(1.0)
    dst = torch.empty_like(src)
    bandwidth = _best_rate(lambda: dst.copy_(src), 2 * src.numel() * 4, seconds / 2)
    try:
        capacity = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        capacity = 16 << 30
    return HardwareProfile(
        f"cpu-{torch.get_num_threads()}t", matmul_flops=flops, mem_bandwidth=bandwidth,
        memory_capacity=int(capacity), interconnect_bandwidth=bandwidth, host_bandwidth=bandwidth,
        dtype="float32", device="cpu", linear_efficiency=1.0, attention_efficiency=1.0,
        memory_efficiency=1.0, kv_efficiency=1.0, interconnect_efficiency=1.0, step_overhead=0.0,
        seq_overhead=0.0, prefill_overhead=0.0, allreduce_latency=0.0, **UNFITTED_SHAPE_TERMS,
    )


def _best_rate(fn, work: float, budget: float) -> float:
    fn()  # warm up
    best = float("inf")
    deadline = time.perf_counter() + budget
    reps = 0
    while reps < 3 or (time.perf_counter() < deadline and reps < 50):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return work / best


#: the file under `schedlab.tiny.cache_dir()` that keeps this machine's `probe_cpu()`
CPU_PROBE_FILE = "cpu-probe.json"


def _machine() -> str:
    """This machine as the CPU probe's cache tells machines apart: the CPU model, the cores
    this process may use, the architecture."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f
                          if ln.startswith("model name")), "")
    except OSError:  # NOTE: not Linux
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model or platform.processor()} x{cores} {platform.machine()}"


def cpu_preset() -> HardwareProfile:
    """The `cpu` preset: this machine's `probe_cpu()`, measured once and kept in the cache
    directory (`$SCHEDLAB_CACHE`, else ~/.cache/schedlab), so that runs on one machine are
    repeatable and a simulated run imports no torch; measured again on another machine (or
    where the file cannot be written: then every run measures)."""
    from schedlab.tiny import cache_dir

    path = cache_dir() / CPU_PROBE_FILE
    machine = _machine()
    try:
        kept = json.loads(path.read_text())
        if kept.get("machine") == machine:
            return HardwareProfile.from_dict(kept["profile"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # NOTE: none kept yet, or unreadable: measure
    profile = probe_cpu()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"machine": machine, "profile": profile.to_dict()}, indent=2))
        tmp.replace(path)
    except OSError:
        pass
    return profile


def get_preset(name: str) -> HardwareProfile:
    key = name.lower().replace("-", "").replace("_", "")
    if key == "cpu":
        return cpu_preset()
    if key in PRESETS:
        return PRESETS[key]
    raise ValueError(f"unknown hardware preset {name!r}; presets: {', '.join(preset_names())} "
                     "(or a path to a profile JSON written by `schedlab calibrate`)")


def resolve_hardware(hw: str | Path | dict[str, Any] | HardwareProfile | None) -> HardwareProfile:
    """A profile from a preset name, a JSON path, a profile, or a dict.

    A dict may name a base with `preset:` or `path:` and override any field; without either
    it must hold every required field. None means the `cpu` preset.
    """
    if hw is None:
        return cpu_preset()
    if isinstance(hw, HardwareProfile):
        return hw
    if isinstance(hw, str | Path):
        s = str(hw)
        if s.endswith(".json") or os.sep in s or Path(s).is_file():
            if not Path(s).is_file():
                raise ValueError(f"hardware={s!r}: no such profile file")
            return HardwareProfile.load(s)
        return get_preset(s)
    data = {k: v for k, v in dict(hw).items() if v is not None}
    preset, path = data.pop("preset", None), data.pop("path", None)
    if preset is not None and path is not None:
        raise ValueError("hardware: give `preset` or `path`, not both")
    base = get_preset(preset) if preset else HardwareProfile.load(path) if path else None
    if base is None:
        return HardwareProfile.from_dict(data)
    return with_overrides(base, data)


def with_overrides(profile: HardwareProfile, overrides: dict[str, Any]) -> HardwareProfile:
    """A copy of `profile` with some fields replaced (unknown names fail with the list)."""
    if not overrides:
        return profile
    known = {f.name for f in fields(HardwareProfile)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown hardware fields {unknown}; accepted: {sorted(known)}")
    return replace(profile, **overrides)
