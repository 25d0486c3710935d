#!/usr/bin/env bash
# One call of the end-to-end benchmark on the benchmark GPU machine (under 10 minutes).
#
# Usage (repo root; .sgc and .cache/bench/git_stamp.json carried):
#   bash bench/gpu_e2e.sh CALL [more `bench/run_e2e.py run` flags]
# CALL: one of `python bench/run_e2e.py calls` (mixed-skewed, vision-skewed, uniform, video, ...).
# Writes to $OUT (default /tmp/e2e_out): <tag>.json (the results) and <tag>_logs.tar.gz (server
# and client logs). TAG (default e2e_<CALL>_<UTC time>) names them; E2E_TIMEOUT (default 560 s)
# bounds the whole call, the harness's own --budget-s (520 s) the measurements.
set -uo pipefail
cd "$(dirname "$0")/.."
CALL=${1:?usage: bash bench/gpu_e2e.sh CALL [run flags]}
shift
if [ -f .sgc/device_env.sh ]; then source .sgc/device_env.sh; else echo "WARN no .sgc/device_env.sh: using this Python's SGLang"; fi
OUT=${OUT:-/tmp/e2e_out}
TAG=${TAG:-e2e_${CALL}_$(date -u +%Y%m%dT%H%M%S)}
LOGS=$(mktemp -d /tmp/e2e_logs.XXXXXX)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
timeout -k 25 "${E2E_TIMEOUT:-560}" python3 bench/run_e2e.py run --call "$CALL" --out "$OUT" --tag "$TAG" \
  --log-dir "$LOGS" "$@"
status=$?
tar -czf "$OUT/${TAG}_logs.tar.gz" -C "$LOGS" . 2>/dev/null || true
ls -la "$OUT"
exit $status
