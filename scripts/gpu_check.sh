#!/usr/bin/env bash
# The GPU path on a real GPU in one command: build llama-cpp-python with CUDA for this
# GPU only, install our package from carried wheels, run scripts/gpu_check.py's steps,
# and leave a report in $OUT (report.md, report.json, build.log, logs/).
#
#   scripts/gpu_check.sh            on the GPU machine (needs .gpu/ from gpu_wheels.sh)
#   scripts/gpu_check.sh --dry-run  on a CPU machine: no build, a fake nvidia-smi with a
#                                   recorded H200's output, the CPU llama.cpp; says so
#
# The device call (docs/gpu.md):
#   run(command="bash scripts/gpu_check.sh", carry=[".gpu"], timeout_s=600)
#
# Time boxes (seconds, whole command under 600): install 30, CUDA build 330 (one
# architecture, sm_90; no FA kernels for every quant pair; ninja on all cores),
# llama-bench 60, the checks what is left (about 150). A build cut by its box is kept
# in .gpu-build/ (git-ignored): run the same command again at once, on the still-warm
# machine, and ninja carries on where it stopped.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
T0=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-570}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/steps.log"; }

if [ "$DRY" = 1 ]; then
    say "DRY RUN: no CUDA build; nvidia-smi is a fake printing a recorded H200's output"
    PY=${PYTHON:-$ROOT/.venv/bin/python}
    bench=""
    for b in "${XDG_CACHE_HOME:-$HOME/.cache}"/inferenceos/llama-tools/*/build/bin/llama-bench; do
        [ -x "$b" ] && bench="--bench $b"
    done
    # shellcheck disable=SC2086
    exec "$PY" scripts/gpu_check.py --dry-run --out "$OUT" --budget-s "$(left)" $bench
fi

GPU=$ROOT/.gpu
SITE=/tmp/ios-site
BUILD=$ROOT/.gpu-build
PY=python3
if [ ! -d "$GPU/wheels" ]; then
    echo "no .gpu/wheels: run scripts/gpu_wheels.sh here first and carry .gpu" >&2
    exit 2
fi
{
    echo "== machine"; nvidia-smi -L; nvcc --version | tail -2; "$PY" --version
    cmake --version | head -1; echo "ninja $(ninja --version)"; echo "cores $(nproc)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

say "install: our wheels into $SITE"
mkdir -p "$SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$GPU"/wheels/*.whl || { say "install failed"; exit 1; }
export PYTHONPATH=$SITE

# built already (a rerun on the warm machine, or a machine that has it): no build
if ! "$PY" -c "import sys, llama_cpp; sys.exit(not llama_cpp.llama_supports_gpu_offload())" \
        2>/dev/null; then
    say "build: llama-cpp-python with CUDA (sm_90 only), box $(( $(left) < 330 ? $(left) : 330 )) s"
    src=$(ls -d "$BUILD"/src/llama_cpp_python-* 2>/dev/null | head -1)
    if [ -z "$src" ]; then
        mkdir -p "$BUILD/src"
        tar -xzf "$GPU"/llama_cpp_python-*-src.tar.gz -C "$BUILD/src"
        src=$(ls -d "$BUILD"/src/llama_cpp_python-* | head -1)
    fi
    export CMAKE_GENERATOR=Ninja
    export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
    # one architecture (H200 = sm_90); flash-attention kernels for the common K/V type
    # pairs only (FA_ALL_QUANTS off: the default, said out loud); RPC as everywhere
    export CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA_ALL_QUANTS=off -DGGML_RPC=ON -DGGML_NATIVE=ON -DLLAMA_CURL=OFF"
    box=$(( $(left) < 330 ? $(left) : 330 ))
    t=$(date +%s)
    timeout "$box" "$PY" -m pip wheel -v --no-build-isolation --no-deps --no-index \
        --config-settings=build-dir="$BUILD/cmake" -w "$BUILD/wheel" "$src" \
        > "$OUT/build.log" 2>&1
    rc=$?
    say "build: exit $rc after $(( $(date +%s) - t )) s (log: build.log)"
    if [ "$rc" != 0 ]; then
        tail -30 "$OUT/build.log"
        [ "$rc" = 124 ] && say "the build outran its box: run this command again at once (ninja resumes in .gpu-build/)"
        exit 1
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" \
        "$BUILD"/wheel/llama_cpp_python-*.whl || exit 1
fi
"$PY" -c "import llama_cpp; print('llama.cpp GPU offload:', llama_cpp.llama_supports_gpu_offload())" \
    | tee -a "$OUT/steps.log"

bench=$(find "$BUILD/cmake" -name llama-bench -type f -perm -u+x 2>/dev/null | head -1)
if [ -z "$bench" ] && [ "$(left)" -gt 200 ]; then
    say "llama-bench: same build tree (ggml objects reused), box 60 s"
    t=$(date +%s)
    # tools on, llava's own mtmd off (llama.cpp's tools/ adds the same mtmd itself)
    cmake -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF "$BUILD/cmake" \
        >> "$OUT/build.log" 2>&1 &&
    timeout 60 cmake --build "$BUILD/cmake" --target llama-bench -j "$(nproc)" \
        >> "$OUT/build.log" 2>&1
    say "llama-bench: exit $? after $(( $(date +%s) - t )) s"
    bench=$(find "$BUILD/cmake" -name llama-bench -type f -perm -u+x 2>/dev/null | head -1)
fi
args=(--out "$OUT" --budget-s "$(( $(left) - 10 ))")
[ -n "$bench" ] && args+=(--bench "$bench")
say "checks: $(( $(left) - 10 )) s left"
"$PY" scripts/gpu_check.py "${args[@]}"
rc=$?
say "done: exit $rc"
exit $rc
