#!/bin/bash
# What admitting a replacement costs the running ranks (issue 46): recover_check's MLP under
# idist::Recovery on 4 ranks, `idist-run --max-restarts 1`; one rank is killed at step 6 and
# idist-run starts another in its place, which the others admit at a step boundary. Prints, per
# round, rank 0's times in the re-form that admitted it: reform() (the new world connected) and
# the reconcile (the replacement's catch-up: the model, the optimizer's momenta, the loader),
# which is where the running ranks wait for it. --replacement-setup-ms adds a slow setup in the
# replacement (a data load): it runs while the job trains on, so it should not show here.
#
#   bash bench/ddp/recovery_admit.sh [ROUNDS] [WIDTH] [SETUP_MS]   # from the repository root, after a build
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
width=${2:-2048}
setup=${3:-0}
RUN=build/apps/idist-run/idist-run
CHECK=build/tests/torch/recover_check
[[ -x $CHECK ]] || { echo "recovery_admit.sh: no $CHECK: build with idist::torch (scripts/setup.sh)" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "| round | width | replacement's setup (ms) | admitted after step | reform() (ms) | reconcile (ms) | caught up (MB) |"
echo "|---|---|---|---|---|---|---|"
for round in $(seq "$rounds"); do
  rm -rf "$dir/ck"
  OMP_NUM_THREADS=1 "$RUN" -n 4 --max-restarts 1 "$CHECK" "$dir/ck" 40 --recover --pause-ms 100 --width "$width" \
    --samples 8192 --batch 64 --progress --replacement-setup-ms "$setup" >"$dir/out" 2>&1 &
  job=$!
  until grep -q "^step 6$" "$dir/out" 2>/dev/null; do sleep 0.02; done
  kill -9 "$(pgrep -P "$job" | sed -n 2p)"
  wait "$job" || { tail -5 "$dir/out" >&2; exit 1; }
  line=$(grep "^recovered: generation 2 " "$dir/out") || { echo "recovery_admit.sh: the replacement was not admitted" >&2; exit 1; }
  python3 - "$line" "$round" "$width" "$setup" <<'PY'
import re, sys
line, round_, width, setup = sys.argv[1:]
f = dict(re.findall(r"(\w+)=([0-9.]+)", line))
after = re.search(r"after_step (\d+)", line).group(1)
print(f"| {round_} | {width} | {setup} | {after} | {float(f['reform_ms']):.0f} | {float(f['reconcile_ms']):.0f} | "
      f"{int(f['caught_up_bytes']) / 1e6:.0f} |")
PY
done
