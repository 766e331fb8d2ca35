#!/bin/bash
# auto_model against PyTorch's DistributedDataParallel, as a user runs each: 2 ranks on one
# host started by idist-run (both sides: the same launcher, placement and environment), one
# intra-op thread per rank, the same network, per-rank batch, data shapes and SGD. Rounds
# alternate the implementations, so that the machine's drift hits all alike:
#   idist single       one process, the per-rank batch, no communication (the compute)
#   idist auto_model   2 ranks
#   idist after_backward  2 ranks, an AVG all_reduce per gradient after backward (dist-mnist's way)
#   torch single, torch ddp (gloo)
# Writes OUT/ddp.jsonl (one line per run) and prints the table that docs/BENCHMARKS.md keeps.
#
#   bash bench/ddp/run.sh [OUT_DIR [ROUNDS]]     # from the repository root, after scripts/setup.sh
#   DDP_CONFIGS="mlp:2" bash bench/ddp/run.sh     # some networks only (NETWORK:BATCH_PER_RANK)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/idist-ddp}
rounds=${2:-3}
mkdir -p "$out"
: >"$out/ddp.jsonl"
RUN=build/apps/idist-run/idist-run
IDIST=build/bench/ddp_idist
PY=/usr/bin/python3
[[ -x $IDIST ]] || { echo "run.sh: no $IDIST: build with idist::torch (scripts/setup.sh)" >&2; exit 1; }
"$PY" -c 'import torch.distributed' 2>/dev/null || { echo "run.sh: $PY has no torch (apt-get install python3-torch)" >&2; exit 1; }

# Network and per-rank batch. The small batches are where communication matters most: the
# larger the batch, the more the step is the same computation on both sides.
read -r -a configs <<<"${DDP_CONFIGS:-resnet18:8 resnet18:16 mlp:2 mlp:8}"
steps=10
for round in $(seq "$rounds"); do
  for config in "${configs[@]}"; do
    set -- ${config/:/ }
    args=(--model "$1" --batch "$2" --steps $steps)
    echo "# round $round: $config" >&2
    "$IDIST" "${args[@]}" --mode single >>"$out/ddp.jsonl"
    "$RUN" -n 2 "$IDIST" "${args[@]}" --mode auto_model >>"$out/ddp.jsonl"
    "$RUN" -n 2 "$PY" bench/ddp/ddp_torch.py "${args[@]}" --mode ddp >>"$out/ddp.jsonl"
    "$PY" bench/ddp/ddp_torch.py "${args[@]}" --mode single >>"$out/ddp.jsonl"
    "$RUN" -n 2 "$IDIST" "${args[@]}" --mode after_backward >>"$out/ddp.jsonl"
  done
done
python3 bench/ddp/report.py "$out/ddp.jsonl"
