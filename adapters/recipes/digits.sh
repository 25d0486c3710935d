#!/usr/bin/env bash
# The fused demo adapters: accuracy-aware knowledge fusion packs the vision tasks of
# examples/fusion/tasks.yaml into as few rank-8 adapters as their required accuracies allow,
# with a trained task head per head-answered task (a minute or two on a 2-core CPU).
set -euo pipefail
TINY=${TINY:-.cache/tiny}
PY=${PY:-python}
"$PY" -m sglang_vlora.tiny_model --out "$TINY"
vlora-fuse --spec examples/fusion/tasks.yaml --base "$TINY/model" --out adapters/digits --threads 1
"$PY" -m sglang_vlora.adapters check adapters/digits/*/ --model "$TINY/model"
