#!/usr/bin/env bash
# Issue 12's GPU checks in one script: about 6-8 minutes on an H200, never more than 9:20 (the
# stage limits add up to 560 s; the device tool allows 600 s a command). See experiments/PERF_NOTES.md.
#
# 1. Here (the CPU machine, with the project's venv), build the wheels the GPU machine lacks:
#        experiments/gpu_check.sh --prepare          # -> .whl/ (git-ignored)
# 2. On the GPU machine (its python3 holds torch, transformers, triton, pytest; nothing can be
#    downloaded there), from the repository root, with .whl carried along:
#        OUT=/some/dir experiments/gpu_check.sh
#
# Stages (each under its own time limit; a failing stage does not stop the others):
#   kernels   pytest tests/kernels tests/test_triton_backend.py -m "gpu or not gpu" (xdist -n 8)
#   gpu       every test marked gpu (and the slow padded-path test that GPU runs in seconds)
#   attn      python -m schedlab.kernels.bench_attention --dtypes bf16 --sweep-splits
#   bench     experiments/bench_gpu.py (its engines in order of value; partial results kept)
# Results: at most 8 files directly under $OUT (the device tool returns no more):
#   summary.txt, pytest.txt, bench_attention.md, bench_gpu.json, bench_gpu.md, gpu_check.log,
#   logs.tar.gz (junit XML and per-stage logs).
set -u -o pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
WHEELS="${WHEELS:-$ROOT/.whl}"

if [[ "${1:-}" == "--prepare" ]]; then
    PY="${PY:-$ROOT/.venv/bin/python}"
    mkdir -p "$WHEELS"
    rm -f "$WHEELS"/schedlab-*.whl
    # the versions this project is tested with; pure-Python wheels, any platform
    "$PY" -m pip download --no-deps --only-binary=:all: -d "$WHEELS" \
        "hydra-core==$("$PY" -c 'import importlib.metadata as m; print(m.version("hydra-core"))')" \
        "omegaconf==$("$PY" -c 'import importlib.metadata as m; print(m.version("omegaconf"))')" \
        || exit 1
    # antlr4's 4.9.3 is an sdist only: build its wheel here
    "$PY" -m pip wheel --no-deps -w "$WHEELS" "antlr4-python3-runtime==4.9.3" || exit 1
    "$PY" -m pip wheel --no-deps -w "$WHEELS" . || exit 1
    ls -l "$WHEELS"
    echo "carry .whl to the GPU machine and run: OUT=<dir> experiments/gpu_check.sh"
    exit 0
fi

OUT="${OUT:?set OUT to the folder results go to}"
PY="${PY:-python3}"
LOGS="$(mktemp -d)"
SITE="$(mktemp -d)"
LOG="$OUT/gpu_check.log"
SUMMARY="$OUT/summary.txt"
mkdir -p "$OUT"
: >"$LOG"
: >"$SUMMARY"
export PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export SCHEDLAB_CACHE="${SCHEDLAB_CACHE:-/tmp/schedlab-cache}"

stage() {  # stage NAME SECONDS COMMAND...: run with a limit, log, record the exit code
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    echo "=== $name: $*" | tee -a "$LOG"
    timeout --signal=INT --kill-after=20 "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    cat "$LOGS/$name.log" >>"$LOG"
    printf '%-8s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$*" | tee -a "$SUMMARY"
    return 0
}

# ---- install what the image lacks: the project and its config libraries, from wheels --------
# the project's wheel is rebuilt from this tree when the image can (setuptools, no network),
# so a stale carried one never runs; the carried one is the fallback
FRESH="$(mktemp -d)"
if "$PY" -m pip wheel --no-deps --no-build-isolation -w "$FRESH" . >>"$LOG" 2>&1; then
    WHLS=("$FRESH"/schedlab-*.whl)
else
    echo "could not build the schedlab wheel here: using the carried one" | tee -a "$SUMMARY"
    WHLS=("$WHEELS"/schedlab-*.whl)
fi
for w in "$WHEELS"/*.whl; do
    [[ "$(basename "$w")" == schedlab-* ]] || WHLS+=("$w")
done
"$PY" -m pip install --no-index --no-deps --target "$SITE" "${WHLS[@]}" >>"$LOG" 2>&1 \
    || echo "wheel install failed (see gpu_check.log)" | tee -a "$SUMMARY"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
{
    echo "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
    "$PY" - <<'EOF'
import importlib.metadata as m, schedlab, torch
print("schedlab from", schedlab.__file__)
for p in ("torch", "transformers", "triton", "hydra-core", "omegaconf", "pytest"):
    try:
        print(p, m.version(p))
    except m.PackageNotFoundError:
        print(p, "missing")
print("cuda available:", torch.cuda.is_available())
EOF
} 2>&1 | tee -a "$SUMMARY" >>"$LOG"

# ---- tests ---------------------------------------------------------------------------------
GPU_TESTS=$( (grep -l "mark.gpu" tests/*.py tests/kernels/*.py; echo tests/test_cuda_graphs.py) \
    2>/dev/null | sort -u | tr '\n' ' ')
# the kernel tests compile a few dozen Triton variants: in parallel where pytest-xdist is there
XDIST=()
"$PY" -c "import xdist" 2>/dev/null && XDIST=(-n 8)
stage kernels 110 "$PY" -m pytest -q -p no:cacheprovider "${XDIST[@]}" --junitxml="$LOGS/kernels.xml" \
    tests/kernels tests/test_triton_backend.py -m "gpu or not gpu"
# shellcheck disable=SC2086
stage gpu 80 "$PY" -m pytest -q -p no:cacheprovider --junitxml="$LOGS/gpu.xml" \
    $GPU_TESTS -m "gpu or slow"
{ echo "## kernels"; tail -n 40 "$LOGS/kernels.log"; echo; echo "## gpu"; tail -n 40 "$LOGS/gpu.log"; } \
    >"$OUT/pytest.txt"

# ---- benchmarks ----------------------------------------------------------------------------
stage attn 110 "$PY" -m schedlab.kernels.bench_attention --dtypes bf16 --sweep-splits
cp "$LOGS/attn.log" "$OUT/bench_attention.md"
mkdir -p "$LOGS/bench_gpu"
stage bench 260 "$PY" experiments/bench_gpu.py --out "$LOGS/bench_gpu" \
    --engines "triton-graphs,triton-eager,sdpa-graphs,sim,sim-calibrated,sdpa-eager,sdpa-chunked,triton-graphs-chunked,hf-cb,hf-static"
cp "$LOGS/bench_gpu/bench_gpu.json" "$LOGS/bench_gpu/bench_gpu.md" "$OUT/" 2>/dev/null

tar -czf "$OUT/logs.tar.gz" -C "$LOGS" . 2>/dev/null
echo "done: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$SUMMARY"
