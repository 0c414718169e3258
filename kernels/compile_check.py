"""Compile the Triton kernels for a GPU architecture on a machine without one, and read from
each binary what it needs: registers, shared memory, spills, which matrix instructions.

    python -m schedlab.kernels.compile_check                 # sm_90 (H100/H200), every case
    python -m schedlab.kernels.compile_check --arch 80 --quick --json out.json

The kernels go through their own launchers, so tile sizes, constexprs and launch options are
the ones a GPU run uses (`interpreting()` reads False, the data types are the GPU's); a
stand-in Triton driver reports the target architecture and each launch compiles (`warmup`)
instead of running. Triton's bundled `ptxas` builds the binary and `cuobjdump` reads its
resource usage and instructions. What this catches before any GPU time is spent: a kernel
that does not compile for the target or in a data type the interpreter never runs (it always
computes in fp32), one that asks for more shared memory than the GPU gives a block (Triton's
"out of resources" at the first launch), and register spills (local memory) in the inner loop.
What it cannot tell: speed and numerics; those need the GPU (`bench_attention`, tests/kernels).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch

#: largest dynamic shared memory a block may opt into, bytes (MaxSharedMemoryPerBlockOptin)
MAX_SHARED = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448, 100: 232_448}
ARCH_NAMES = {80: "A100", 86: "A10/RTX 30", 89: "L4/L40/RTX 40", 90: "H100/H200", 100: "B200"}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True, slots=True)
class Shape:
    """Attention shape of a model family: query heads, KV heads, head size."""

    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int


SHAPES = (
    Shape("llama-1b", 32, 8, 64),  # issue 12's 1.1B model (TinyLlama's shape)
    Shape("llama-8b", 32, 8, 128),
    Shape("qwen-7b", 28, 4, 128),  # a group of 7: not a power of two
    Shape("mha-d64", 12, 12, 64),  # no grouping (GPT-2-like)
)
BLOCK_SIZE = 16
#: context of the decode cases and chunk lengths of the prefill cases
DECODE_CTX, DECODE_SPLITS, PREFILL_CHUNKS = 2048, 8, (512, 16)


@dataclass(slots=True)
class Compiled:
    """One kernel binary and what it needs."""

    case: str  # launcher and shape, e.g. "decode split=8 llama-1b bf16"
    kernel: str
    num_warps: int
    num_stages: int
    shared: int  # dynamic shared memory, bytes
    registers: int | None
    spill_bytes: int | None  # local memory per thread (spills)
    mma: str  # "wgmma" (Hopper HGMMA), "mma" (HMMA), "none" (FMA / no dot)
    problem: str = ""  # empty: fits; else why it cannot run well or at all


class _TargetDriver:
    """Enough of a Triton driver for `JITFunction.warmup` to compile for `arch` off-GPU."""

    def __init__(self, arch: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


class _Compiling:
    """Stands in for a kernel object in its module: `kernel[grid](...)` compiles, records."""

    def __init__(self, fn, sink: list) -> None:
        self.fn, self.sink = fn, sink

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.sink.append(self.fn.warmup(*args, grid=grid, **kwargs))
        return launch


def _cuda_tool(name: str) -> str:
    import triton.backends.nvidia as nv

    path = Path(nv.__file__).parent / "bin" / name
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: compile_check needs the CUDA tools that Triton's "
                           "Linux wheel bundles")
    return str(path)


def inspect_binary(cubin: bytes) -> tuple[int | None, int | None, str]:
    """Registers, local-memory bytes (spills) and matrix-instruction kind of a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([_cuda_tool("cuobjdump"), "-res-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([_cuda_tool("cuobjdump"), "-sass", f.name],
                              capture_output=True, text=True, check=True).stdout
    reg = re.search(r"REG:(\d+)", usage)
    local = re.search(r"LOCAL:(\d+)", usage)
    mma = "wgmma" if "HGMMA" in sass else "mma" if "HMMA" in sass else "none"
    return (int(reg.group(1)) if reg else None, int(local.group(1)) if local else None, mma)


@contextlib.contextmanager
def compiling_for(arch: int) -> Iterator[list]:
    """Inside: every kernel launch compiles for `arch` and appends its `CompiledKernel`."""
    from unittest import mock

    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    from schedlab.kernels import _launch, decode_attention, prefill_attention, store_kv

    sink: list = []
    with contextlib.ExitStack() as stack:
        for module in (decode_attention, prefill_attention, store_kv):
            for name in module.JIT_KERNELS:
                fn = getattr(module, name)
                if not isinstance(fn, JITFunction):
                    raise RuntimeError("the kernels were imported for Triton's interpreter: "
                                       "run compile_check in a process without TRITON_INTERPRET")
                stack.enter_context(mock.patch.object(module, name, _Compiling(fn, sink)))
        for module in (_launch, decode_attention):  # the GPU's tile sizes and dot precision
            stack.enter_context(mock.patch.object(module, "interpreting", lambda: False))
        try:
            previous = driver.active
        except RuntimeError:  # no GPU driver here: nothing to give back afterwards
            previous = None
        driver.set_active(_TargetDriver(arch))
        if previous is not None:
            stack.callback(driver.set_active, previous)
        yield sink


def launches(shape: Shape, dtype: torch.dtype,
             tiles=None) -> Iterator[tuple[str, Callable[[], object]]]:
    """(case name, thunk calling a launcher) for every kernel variant the engine launches."""
    from schedlab.kernels.decode_attention import paged_decode
    from schedlab.kernels.prefill_attention import paged_prefill
    from schedlab.kernels.store_kv import store_kv

    h, hkv, d = shape.num_heads, shape.num_kv_heads, shape.head_dim
    width = DECODE_CTX // BLOCK_SIZE
    kc = torch.zeros(width, BLOCK_SIZE, hkv, d, dtype=dtype)
    vc = torch.zeros_like(kc)
    tables = torch.zeros(2, width, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    q = torch.zeros(2, h, d, dtype=dtype)
    kv = torch.zeros(4, hkv, d, dtype=dtype)
    yield "store_kv", lambda: store_kv(kv, kv, kc, vc, torch.zeros(4, dtype=torch.int64))
    yield "decode", lambda: paged_decode(q, kc, vc, tables, lens, 0.1, DECODE_CTX, num_splits=1)
    yield f"decode split={DECODE_SPLITS}", lambda: paged_decode(
        q, kc, vc, tables, lens, 0.1, DECODE_CTX, num_splits=DECODE_SPLITS)
    for chunk in PREFILL_CHUNKS:
        rows = torch.zeros(chunk, h, d, dtype=dtype)
        starts = torch.tensor([0, chunk, chunk], dtype=torch.int32)
        label = f"prefill chunk={chunk}" + (
            f" tiles={tiles.block_m},{tiles.block_n},{tiles.num_warps},{tiles.num_stages}"
            if tiles else "")
        yield label, partial(paged_prefill, rows, kc, vc, tables, lens, starts, 0.1, chunk,
                             tiles=tiles)


def check(arch: int, shapes=SHAPES, dtypes=tuple(DTYPES), tiles=None,
          cases: tuple[str, ...] = (), max_shared: int | None = None) -> list[Compiled]:
    """Compile every launch of `launches` for `arch` (only the cases whose name starts with
    one of `cases`, when given); one `Compiled` per kernel binary.

    `max_shared`: a block's shared-memory limit in bytes (default: `MAX_SHARED[arch]`).
    """
    limit = max_shared or MAX_SHARED[arch]
    out: list[Compiled] = []
    with compiling_for(arch) as sink:
        for shape in shapes:
            for dt_name in dtypes:
                for case, launch in launches(shape, DTYPES[dt_name], tiles):
                    if cases and not case.startswith(cases):
                        continue
                    label = f"{case} {shape.name} {dt_name}"
                    sink.clear()
                    try:
                        launch()
                    except Exception as e:  # a compile error is a finding, not a crash
                        msg = str(e).strip().splitlines()
                        out.append(Compiled(label, "?", 0, 0, 0, None, None, "none",
                                            f"does not compile: {msg[-1] if msg else type(e)}"))
                        continue
                    for k in sink:
                        regs, local, mma = inspect_binary(k.asm["cubin"])
                        md = k.metadata
                        problem = ""
                        if md.shared > limit:
                            problem = f"needs {md.shared} B shared memory, sm_{arch} gives {limit}"
                        elif local:
                            problem = f"spills {local} B per thread to local memory"
                        out.append(Compiled(label, md.name, md.num_warps, md.num_stages,
                                            md.shared, regs, local, mma, problem))
    return out


def markdown(arch: int, rows: list[Compiled]) -> str:
    head = (f"### Triton kernels compiled for sm_{arch} ({ARCH_NAMES.get(arch, '?')}), "
            f"block size {BLOCK_SIZE}\n\n| case | kernel | warps | stages | shared (KiB) "
            "| registers | spills (B) | MMA | problem |\n|---|---|---|---|---|---|---|---|---|")
    lines = [f"| {r.case} | {r.kernel} | {r.num_warps} | {r.num_stages} | "
             f"{r.shared / 1024:.1f} | {r.registers} | {r.spill_bytes} | {r.mma} | "
             f"{r.problem or '-'} |" for r in rows]
    return "\n".join([head, *lines])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m schedlab.kernels.compile_check",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90,
                    help=f"compute capability x10; known: {sorted(MAX_SHARED)} (default 90)")
    ap.add_argument("--dtypes", default=",".join(DTYPES),
                    help=f"comma-separated, from {', '.join(DTYPES)}")
    ap.add_argument("--quick", action="store_true", help=f"only the {SHAPES[0].name} shape")
    ap.add_argument("--tiles", default=None, metavar="M,N,WARPS,STAGES",
                    help="prefill tiles to check instead of the default (as bench_attention's "
                         "--sweep-prefill takes them)")
    ap.add_argument("--cases", default="", metavar="NAME[,NAME]",
                    help="only these launchers: store_kv, decode, prefill (default: all)")
    ap.add_argument("--max-shared", type=int, default=None, metavar="BYTES",
                    help="a block's shared-memory limit (default: the architecture's)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        ap.error(f"--dtypes {','.join(bad)}: accepted: {', '.join(DTYPES)}")
    if args.arch not in MAX_SHARED and not args.max_shared:
        ap.error(f"--arch {args.arch}: known {sorted(MAX_SHARED)}; for another, give its "
                 "--max-shared")
    tiles = None
    if args.tiles:
        from schedlab.kernels.prefill_attention import PrefillTiles

        try:
            m, n, w, s = (int(x) for x in args.tiles.split(","))
        except ValueError:
            ap.error(f"--tiles {args.tiles!r}: expected four integers M,N,WARPS,STAGES")
        tiles = PrefillTiles(m, n, w, s)
    try:
        cases = tuple(c.strip() for c in args.cases.split(",") if c.strip())
        rows = check(args.arch, SHAPES[:1] if args.quick else SHAPES, dtypes, tiles, cases,
                     args.max_shared)
    except RuntimeError as e:
        print(f"compile_check: {e}", file=sys.stderr)
        return 2
    print(markdown(args.arch, rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    problems = [r for r in rows if r.problem]
    print(f"\n{len(rows)} kernel binaries, {len(problems)} with a problem")
    return 1 if problems else 0


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)  # read when the kernels are decorated (imported)
    sys.exit(main())
