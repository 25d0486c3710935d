#!/usr/bin/env bash
# The tiny random Qwen2-VL and its three PEFT adapters (a8: rank 8 on attention, b16: rank 16
# on q, v and the MLP, c32: rank 32 on everything), built from seed 0 with peft itself.
# The tests, `make serve` and the benchmarks' CPU scale use them.
set -euo pipefail
OUT=${OUT:-.cache/tiny}
PY=${PY:-python}
"$PY" -m sglang_vlora.tiny_model --out "$OUT"
"$PY" -m sglang_vlora.adapters check "$OUT"/adapters/* --model "$OUT/model" --max-lora-rank 32
