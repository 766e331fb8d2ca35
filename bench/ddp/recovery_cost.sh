#!/bin/bash
# What opting in to live recovery costs a training step when nothing fails (issue 46's target:
# within 2%): auto_model on 2 ranks under idist-run, init() with and without
# InitOptions::recovery (the heartbeat thread; the cascade hook costs nothing until a loss), and
# each step through idist::Recovery::step besides (--recover: the buffers' and the generator's
# copy, the commit), in alternating runs so that the machine's drift hits all alike. Prints each
# configuration's median of the runs' median steps, side by side, and the ratios.
#
#   bash bench/ddp/recovery_cost.sh [ROUNDS]     # from the repository root, after a build with idist::torch
#   DDP_CONFIGS="mlp:2" bash bench/ddp/recovery_cost.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-5}
RUN=build/apps/idist-run/idist-run
IDIST=build/bench/ddp_idist
[[ -x $IDIST ]] || { echo "recovery_cost.sh: no $IDIST: build with idist::torch (scripts/setup.sh)" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
read -r -a configs <<<"${DDP_CONFIGS:-mlp:2 resnet18:8}"
for round in $(seq "$rounds"); do
  for config in "${configs[@]}"; do
    set -- ${config/:/ }
    args=(--model "$1" --batch "$2" --steps 10 --mode auto_model)
    echo "# round $round: $config" >&2
    "$RUN" -n 2 "$IDIST" "${args[@]}" >>"$out"
    "$RUN" -n 2 "$IDIST" "${args[@]}" --recovery >>"$out"
    "$RUN" -n 2 "$IDIST" "${args[@]}" --recover >>"$out"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
print("| network, batch per rank | auto_model step (ms) | init with recovery (ms) | and Recovery::step (ms) | ratios |")
print("|---|---|---|---|---|")
def median(key, recovery, recover):
    return statistics.median(r["step_ms_median"] for r in runs if (r["model"], r["batch_per_rank"]) == key
                             and r["recovery"] == recovery and r.get("recover", False) == recover)
for key in sorted({(r["model"], r["batch_per_rank"]) for r in runs}):
    off, on, step = median(key, False, False), median(key, True, False), median(key, True, True)
    print(f"| {key[0]}, {key[1]} | {off:.2f} | {on:.2f} | {step:.2f} | {on / off:.3f}, {step / off:.3f} |")
PY
