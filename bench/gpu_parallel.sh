#!/usr/bin/env bash
# Several end-to-end calls at once on a machine of several GPUs, one call per GPU (under 10 minutes).
#
# Usage (repo root; .sgc and .cache/bench/git_stamp.json carried):
#   bash bench/gpu_parallel.sh 'CALL [run flags]' ['CALL [run flags]' ...]
# Call i runs `bash bench/gpu_e2e.sh CALL [run flags]` on GPU i (CUDA_VISIBLE_DEVICES=i), all at
# the same time; a call line may also be `test-gpu`, which runs `make test-gpu`'s tests there instead
# (the CUDA extension's build limited to MAX_JOBS=4 compiler jobs, to leave the other calls the CPUs),
# or `test-gpu-server`, which runs `make test-gpu-server`'s reliability corpus and task-head tests against a GPU server
# with CUDA graphs (this environment's flags: GPU_TEST_SERVER_FLAGS below; log tests_server.log).
# Each call's servers and client see only their own GPU, so the systems of one call are still
# compared on one GPU, with the same neighbours, as in bench/gpu_e2e.sh. With more than one line
# each call runs on a share of the host's CPUs (python3 bench/run_e2e.py cpu-shares: equal blocks
# of whole cores), so a call that pins its servers (--cpus-per-server) picks its blocks from its
# share. The calls still share the host's caches and memory: a host-bound point (eager prefill)
# may run slower than it would alone, alike for the systems of a call; compare systems within a
# call, not the same system across calls. Do not put a
# text call beside a vision call: the vision call's image work on the host's CPUs moved a text
# call's floor prefill from about 60 to up to 103 ms from round to round, and two identical
# servers then read up to 30% apart (docs/bench.md, "What the harness resolves"): such a pair is
# refused unless E2E_ALLOW_MIXED=1 (python3 bench/run_e2e.py parallel-check, before anything starts).
# The check also warns where two lines would send the same request traces (round r of a call
# with --seed S sends client seed S + r): give calls meant as independent seeds --repeats apart.
# Writes to $OUT: <tag>.json per call, tests.log, and one calls_logs.tar.gz of every call's
# logs (a device machine returns at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bash bench/gpu_parallel.sh 'CALL [run flags]' ..." >&2; exit 2; }
OUT=${OUT:-/tmp/e2e_out}
mkdir -p "$OUT"
for line in "$@"; do
  [ -n "${line// /}" ] || { echo "gpu_parallel: an empty call line" >&2; exit 2; }
done
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$#" -gt "$GPUS" ]; then
  echo "gpu_parallel: $# calls but $GPUS GPUs" >&2
  exit 2
fi
if [ -f .sgc/device_env.sh ]; then source .sgc/device_env.sh; fi  # installs once, before the calls race
# Call lines run would refuse, or a text call beside a vision call: refused before anything starts.
python3 bench/run_e2e.py parallel-check ${E2E_ALLOW_MIXED:+--allow-mixed} -- "$@" || exit 2
# The model and adapters every call reads, built once: calls building them at the same time
# would write the same files.
python3 bench/run_e2e.py prepare --scale gpu || exit 1
SHARES=()
if [ "$#" -gt 1 ]; then
  mapfile -t SHARES < <(python3 bench/run_e2e.py cpu-shares "$#") && [ "${#SHARES[@]}" -eq "$#" ] || exit 2
fi
STAMP=$(date -u +%Y%m%dT%H%M%S)
PARTS=$(mktemp -d /tmp/gpu_parallel.XXXXXX)
pids=()
i=0
for line in "$@"; do
  read -r -a words <<< "$line"
  ON=()  # the call's share of the CPUs, where it has one
  [ "${#SHARES[@]}" -gt 0 ] && ON=(python3 bench/run_e2e.py on-cpus "${SHARES[$i]}" --)
  [ "${#ON[@]}" -gt 0 ] && echo "gpu_parallel: call $i on CPUs ${SHARES[$i]}"
  if [ "${words[0]}" = test-gpu ]; then
    ( export CUDA_VISIBLE_DEVICES=$i TRITON_INTERPRET=0 MAX_JOBS=${MAX_JOBS:-4}
      timeout -k 20 "${TEST_TIMEOUT:-560}" "${ON[@]}" python3 -m pytest -q -p no:cacheprovider \
        tests/kernels/test_cuda.py tests/kernels/test_cuda_sources.py tests/gpu "${words[@]:1}" \
        > "$OUT/tests.log" 2>&1 ) &
  elif [ "${words[0]}" = test-gpu-server ]; then  # the Makefile's GPU_SERVER_TESTS, run without its .venv
    ( export CUDA_VISIBLE_DEVICES=$i TRITON_INTERPRET=0 \
        VLORA_TEST_SERVER_FLAGS="${GPU_TEST_SERVER_FLAGS:---attention-backend triton --sampling-backend pytorch --mm-attention-backend sdpa --max-total-tokens 16384}"
      EP=$(python3 -c "import tempfile; from sglang_vlora.server_process import entry_point_dir as e; print(e(tempfile.mkdtemp()))")
      export PYTHONPATH=$PWD:$EP${PYTHONPATH:+:$PYTHONPATH}
      timeout -k 20 "${TEST_TIMEOUT:-560}" "${ON[@]}" python3 -m pytest -q -p no:cacheprovider \
        tests/reliability/test_bad_input.py tests/reliability/test_field_types.py \
        tests/server/test_heads.py tests/reliability/test_profile_requests.py "${words[@]:1}" \
        > "$OUT/tests_server.log" 2>&1 ) &
  else
    ( export CUDA_VISIBLE_DEVICES=$i OUT=$PARTS/call$i TAG=e2e_${words[0]}_${STAMP}_gpu$i
      "${ON[@]}" bash bench/gpu_e2e.sh "${words[@]}" > "$PARTS/call$i.log" 2>&1 ) &
  fi
  pids+=($!)
  i=$((i + 1))
done
status=0
for j in "${!pids[@]}"; do
  wait "${pids[$j]}"; rc=$?
  echo "gpu_parallel: call $j (${*:$((j + 1)):1}) exited $rc"
  [ "$rc" -eq 0 ] || status=1
done
for d in "$PARTS"/call*/; do
  [ -d "$d" ] && mv "$d"/*.json "$OUT"/ 2>/dev/null
done
tar -czf "$OUT/calls_logs.tar.gz" -C "$PARTS" . 2>/dev/null || true
tail -n 5 "$PARTS"/call*.log 2>/dev/null
[ -f "$OUT/tests.log" ] && tail -n 15 "$OUT/tests.log"
[ -f "$OUT/tests_server.log" ] && tail -n 15 "$OUT/tests_server.log"
ls -la "$OUT"
exit $status
