#!/bin/bash
# From a lost rank to the survivors' next committed step, where a survivor is one step behind
# and takes the step from one ahead (issue 46's target: 2 s with the catch-up): bench/ddp's MLP
# (two 4096 x 4096 layers, 33.6 M parameters: 268 MB of state with momentum) under
# idist::Recovery on N ranks; rank 1 lets the others commit step 3, kills the last rank and
# raises before its own optimizer step (tests/torch/recover_check.cpp --stage-behind), so that
# it takes step 3 from rank 0 while rank 0 redoes step 4. Prints, per round, the time from the
# kill to rank 0's redone step committed, and its parts (until rank 0's step raised, reform(), the
# reconcile with the catch-up).
#
#   bash bench/ddp/recovery_time.sh [ROUNDS] [RANKS] [WIDTH]   # from the repository root, after a build
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
ranks=${2:-3}
width=${3:-4096}
RUN=build/apps/idist-run/idist-run
CHECK=build/tests/torch/recover_check
[[ -x $CHECK ]] || { echo "recovery_time.sh: no $CHECK: build with idist::torch (scripts/setup.sh)" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "| round | ranks | kill -> next committed step (ms) | kill -> rank 0's step raised (ms) | reform() (ms) | reconcile (ms) | caught up (MB) |"
echo "|---|---|---|---|---|---|---|"
for round in $(seq "$rounds"); do
  rm -rf "$dir/ck"
  OMP_NUM_THREADS=1 "$RUN" -n "$ranks" "$CHECK" "$dir/ck" 6 --width "$width" --samples 256 --batch 32 --recover \
    --stage-behind "1:$((ranks - 1)):3" >"$dir/out" 2>&1 || { tail -5 "$dir/out" >&2; exit 1; }
  python3 - "$dir/out" "$round" "$ranks" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
killed = int(re.search(r"killed_ns=(\d+)", text).group(1))
line = re.search(r"^recovered: .*", text, re.M).group(0)
get = lambda k: re.search(k + r"=([\d.]+)", line).group(1)
raised = int(get('raised_ns'))
print(f"| {sys.argv[2]} | {sys.argv[3]} -> {int(sys.argv[3]) - 1} | {(int(get('committed_ns')) - killed) / 1e6:.0f} | "
      f"{(raised - killed) / 1e6 if raised else float('nan'):.0f} | {float(get('reform_ms')):.0f} | {float(get('reconcile_ms')):.0f} | {int(get('caught_up_bytes')) / 1e6:.0f} |")
PY
done
