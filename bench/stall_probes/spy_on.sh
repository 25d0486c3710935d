#!/usr/bin/env bash
# Sample one benchmark server's processes with py-spy, in time order, while a call runs.
#
# Usage (repo root, beside a call that starts its servers with logs under /tmp/e2e_logs.*):
#   bash bench/stall_probes/spy_on.sh SYSTEM SECONDS OUT_FILE [RATE] &
# Waits for the newest /tmp/e2e_logs.*/SYSTEM.log to say the server is up, then records its
# launcher and every child (scheduler, detokenizer) for SECONDS at RATE samples a second
# (default 100), idle samples kept so that a thread's samples stay in time order, without
# pausing the processes (--nonblocking), as speedscope JSON; gzipped to OUT_FILE.gz.
# `python bench/stall_probes/spy_runs.py OUT_FILE.gz` lists the longest stretches of one stack.
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: bash bench/stall_probes/spy_on.sh SYSTEM SECONDS OUT_FILE [RATE]" >&2; exit 2; }
SYSTEM=$1 SECONDS_TO_RECORD=$2 OUT_FILE=$3 RATE=${4:-100}
for n in "$SECONDS_TO_RECORD" "$RATE"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "spy_on: SECONDS and RATE must be whole numbers above 0, got '$n'" >&2; exit 2; }
done
[ -d "$(dirname "$OUT_FILE")" ] || { echo "spy_on: no folder $(dirname "$OUT_FILE") for $OUT_FILE" >&2; exit 2; }
command -v py-spy >/dev/null || { echo "spy_on: py-spy is not on PATH" >&2; exit 2; }
for _ in $(seq 1 900); do
  LOG=$(ls -t /tmp/e2e_logs.*/"$SYSTEM".log 2>/dev/null | head -n 1)
  if [ -n "$LOG" ] && grep -q "The server is fired up" "$LOG"; then break; fi
  sleep 1
done
[ -n "${LOG:-}" ] || { echo "spy_on: no $SYSTEM.log appeared" >&2; exit 1; }
PORT=$(head -n 1 "$LOG" | grep -o -- '--port [0-9]*' | awk '{print $2}')
PID=$([ -n "$PORT" ] && pgrep -o -f -- "--port $PORT( |$)")
[ -n "$PID" ] || { echo "spy_on: no process of $SYSTEM found" >&2; exit 1; }
echo "spy_on: recording $SYSTEM (pid $PID) for $SECONDS_TO_RECORD s at $RATE a second from $(date +%s.%N)"
py-spy record --pid "$PID" --subprocesses --idle --nonblocking --rate "$RATE" --duration "$SECONDS_TO_RECORD" \
  --format speedscope --output "$OUT_FILE" >/dev/null || { echo "spy_on: py-spy failed (above)" >&2; exit 1; }
gzip -f "$OUT_FILE" && echo "spy_on: wrote $OUT_FILE.gz"
