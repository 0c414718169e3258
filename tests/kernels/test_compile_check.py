"""The kernels compile for real GPUs here, with no GPU: what the interpreter cannot show (bf16
and fp16 code, tensor-core use, shared memory and registers of the compiled binary)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")
NV_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
pytestmark = pytest.mark.skipif(not (NV_BIN / "cuobjdump").is_file(),
                                reason="Triton's bundled CUDA tools are missing (non-Linux wheel)")


def compile_check(tmp_path: Path, *args: str) -> tuple[int, str, list[dict]]:
    """Run the checker as a user does (its own process: the kernels must not be interpreted)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, "-m", "schedlab.kernels.compile_check", "--json", str(out), *args],
        capture_output=True, text=True, env=env, timeout=600)
    rows = json.loads(out.read_text()) if out.is_file() else []
    return proc.returncode, proc.stdout + proc.stderr, rows


def test_kernels_compile_for_an_h200_on_tensor_cores_without_spills(tmp_path):
    rc, out, rows = compile_check(tmp_path, "--quick", "--dtypes", "bf16")
    assert rc == 0, out
    assert {r["kernel"] for r in rows} == {
        "_store_kv_kernel", "_decode_kernel", "_reduce_kernel", "_prefill_kernel"}
    assert all(not r["problem"] and r["spill_bytes"] == 0 for r in rows), out
    attention = [r for r in rows if r["kernel"] in ("_decode_kernel", "_prefill_kernel")]
    assert all(r["mma"] != "none" for r in attention), out  # bf16 dots on tensor cores
    long_prefill = [r for r in rows if r["case"].startswith("prefill chunk=512")]
    assert long_prefill and all(r["mma"] == "wgmma" for r in long_prefill), out  # Hopper MMA
    assert "| decode llama-1b bf16 | _decode_kernel |" in out


def test_a_kernel_needing_more_shared_memory_than_the_gpu_gives_is_reported(tmp_path):
    # the default bf16 prefill tiles need ~40 KiB: against a 32 KiB block limit they cannot launch
    rc, out, rows = compile_check(tmp_path, "--quick", "--cases", "prefill", "--dtypes", "bf16",
                                  "--max-shared", str(32 * 1024))
    assert rc == 1, out
    big = [r for r in rows if r["case"].startswith("prefill chunk=512")]
    assert big and big[0]["shared"] > 32 * 1024, out
    assert "shared memory, sm_90 gives 32768" in big[0]["problem"]
    assert all(not r["problem"] for r in rows if r["shared"] <= 32 * 1024), out
    assert "with a problem" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernels are compiled")
def test_checking_interpreted_kernels_says_how_to_run_it():
    from schedlab.kernels import compile_check as cc

    with pytest.raises(RuntimeError, match="without TRITON_INTERPRET"):
        cc.check(90, cc.SHAPES[:1], ("bf16",))


def test_bad_arguments_name_the_accepted_values(capsys):
    """Refused by the argument parser before any kernel is imported: tested in process."""
    from schedlab.kernels import compile_check as cc

    for argv, words in ((["--dtypes", "int8"], ["accepted: bf16, fp16, fp32"]),
                        (["--arch", "75"], ["known [80, 86, 89, 90, 100]", "--max-shared"])):
        with pytest.raises(SystemExit) as e:
            cc.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and all(w in err for w in words), err


@pytest.mark.slow  # ~1.5 min per architecture on 2 cores
@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="on a GPU the kernel tests compile and run every variant themselves")
@pytest.mark.parametrize("arch", [90, 80])
def test_every_shape_and_dtype_compiles_and_fits(tmp_path, arch):
    rc, out, rows = compile_check(tmp_path, "--arch", str(arch))
    assert rc == 0, out
    assert len(rows) == 4 * 3 * 6  # shapes x dtypes x (store, decode, split + reduce, 2 prefills)
