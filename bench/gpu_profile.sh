#!/usr/bin/env bash
# On the benchmark GPU machine, from the repo root, with .sgc carried:
#     bash bench/gpu_profile.sh [SYSTEMS...]
# Profiles the systems' servers (bench/profile_server.py) and runs the kernel benchmark on
# Qwen2-VL-7B's projection shapes, writing summaries and logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f .sgc/device_env.sh ] && source .sgc/device_env.sh  # else: sourced by the caller
# A copy of the tree inside another checkout: git must not report the enclosing repository's
# revision (bench/provenance.py then reads the stamp carried with the copy).
export GIT_CEILING_DIRECTORIES=${GIT_CEILING_DIRECTORIES:-$(dirname "$PWD")}
export PYTHONPATH=$PWD:$PYTHONPATH TRITON_INTERPRET=0
OUT=${OUT:-/tmp/gpu_profile_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
WORK=/tmp/vlora_prof
rm -rf "$WORK"
SYSTEMS=${*:-nolora csgmv atmm}
timeout ${PROFILE_TIMEOUT:-420} python3 bench/profile_server.py --out "$WORK" --systems $SYSTEMS ${PROFILE_ARGS:-}
echo "profile exit $?"
cp "$WORK"/profile.json "$OUT"/ 2>/dev/null
tail -n 60 "$WORK"/server_*.log > "$OUT/server_logs.txt" 2>/dev/null
(cd "$WORK" && tar czf "$OUT/traces.tgz" $(ls traces/*/*decode8* traces/*/*prefill1* 2>/dev/null | head -12)) 2>/dev/null
if [ -n "${KERNELS:-}" ]; then
  timeout ${KERNELS_TIMEOUT:-200} python3 bench/kernels.py --shapes q2_qkv q2_o --ranks 64 --quick --check \
    --out "$OUT" --tag kernels_h200_q2
  echo "kernels exit $?"
fi
ls -la "$OUT"
