#!/usr/bin/env bash
# GPU check of the CUDA C++ ATMM implementation, in one go, from any directory:
#
#     bash bench/gpu_check_cuda.sh [OUT_DIR]
#
# 1. builds the extension (sglang_vlora.atmm.cuda_ext; full compiler log in
#    OUT_DIR/cuda_build.log, printed whole if the build fails),
# 2. compiles cuda/atmm_kernels.cu with bare nvcc (no torch headers),
# 3. runs the GPU kernel tests (CUDA and Triton implementations against fp64),
# 4. benchmarks a few cells with every method, atmm_cuda included (bench/kernels.py --quick),
# 5. runs a small tuning pass that times both implementations (table to OUT_DIR, the
#    shipped table is not touched; SKIP_TUNE=1 leaves it out).
# Steps 4 and 5 run under timeouts (BENCH_TIMEOUT=240, TUNE_TIMEOUT=180 s) so the whole
# script stays under 10 minutes on an H100.
# Every step runs even if an earlier one failed; the summary lists each step's exit code
# and the script exits non-zero if any failed. OUT_DIR defaults to $OUT, else
# /tmp/gpu_check_cuda. The build cache goes to $SGLANG_VLORA_CACHE (default
# OUT_DIR/cache, so every run builds from scratch and the build time is visible).
set -x
cd "$(dirname "$0")/.." || exit 2
OUT_DIR=${1:-${OUT:-/tmp/gpu_check_cuda}}
mkdir -p "$OUT_DIR"
export SGLANG_VLORA_CACHE=${SGLANG_VLORA_CACHE:-$OUT_DIR/cache}
export TRITON_INTERPRET=0
PY=${PYTHON:-python}
SUMMARY=()
FAILED=0

step() {  # step NAME CMD...: run, record the exit code, never stop the script
  local name=$1
  shift
  echo "================ $name: $*"
  local t0=$SECONDS
  "$@"
  local rc=$?
  echo "================ $name: rc=$rc ($((SECONDS - t0)) s)"
  SUMMARY+=("$name rc=$rc $((SECONDS - t0))s")
  [ "$rc" -ne 0 ] && FAILED=1
  return 0
}

nvidia-smi
command -v nvcc && nvcc --version
$PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name(0))"

build() {
  SGLANG_VLORA_CUDA_VERBOSE=1 $PY -m sglang_vlora.atmm.cuda_ext --verbose >"$OUT_DIR/cuda_build.log" 2>&1
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "---- BUILD FAILED, full log ($OUT_DIR/cuda_build.log):"
    cat "$OUT_DIR/cuda_build.log"
  else
    tail -n 5 "$OUT_DIR/cuda_build.log"
  fi
  return "$rc"
}
step build build

bare_nvcc() {
  nvcc -arch=sm_90 -std=c++17 -O3 -c cuda/atmm_kernels.cu -o "$OUT_DIR/atmm_kernels.o" -Xptxas -v \
    >"$OUT_DIR/nvcc_ptxas.log" 2>&1
  local rc=$?
  [ "$rc" -ne 0 ] && cat "$OUT_DIR/nvcc_ptxas.log"
  grep -c "0 bytes spill stores" "$OUT_DIR/nvcc_ptxas.log"
  grep -E "[1-9][0-9]* bytes spill stores" "$OUT_DIR/nvcc_ptxas.log"
  return "$rc"
}
step bare_nvcc bare_nvcc

step pytest_cuda $PY -m pytest -q -p no:cacheprovider -rs tests/kernels/test_cuda.py tests/kernels/test_cuda_sources.py

step bench timeout "${BENCH_TIMEOUT:-240}" $PY bench/kernels.py --quick --shapes proj qkv --ranks 64 --check \
  --iters 20 --out "$OUT_DIR" --tag gpu_check_cuda

if [ -z "${SKIP_TUNE:-}" ]; then
  step tune timeout "${TUNE_TIMEOUT:-180}" $PY -m sglang_vlora.atmm.tune --dims 4096:4096 --ranks 64 \
    --tokens 1 32 1024 --reps 5 --iters 3 --workers 8 --budget-s 60 --cuda-budget-s 30 \
    --impls triton cuda --out "$OUT_DIR/tune_check.json"
  [ -f "$OUT_DIR/tune_check.json" ] && grep -E '"impl"' "$OUT_DIR/tune_check.json"
fi

set +x
echo "================ summary (outputs in $OUT_DIR)"
printf '  %s\n' "${SUMMARY[@]}"
[ "$FAILED" -eq 0 ] && echo "ALL STEPS PASSED" || echo "SOME STEPS FAILED"
exit "$FAILED"
