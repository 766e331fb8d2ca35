#!/bin/bash
# Issue 46's 20-failure run: idist::Recovery on tests/torch/recover_check's MLP (with dropout),
# 4 ranks on one host under idist-run --max-restarts 20, while FAILURES failures are injected at
# random times into random ranks: kill -9 (3 in 4) or SIGSTOP (1 in 4, stopped by idist-run's
# heartbeat watch after --heartbeat-timeout 1). Each lost rank is replaced (a rank started in
# its place, admitted at a step boundary). Prints the run's end, the re-forms, the steps redone,
# the samples seen, and the final parameters and loss beside a run without failures and runs on
# 3, 2 and 1 processes (the tolerance: how far the world size alone moves them, the largest of
# the three); writes DIR/loss.tsv (step, loss with
# failures, loss without) and, where gnuplot is installed, docs/bench-recovery-churn.png. Its
# last line, "# churn: injected=... exit=... steps=...", is what tests/torch/churn.sh checks.
#
#   bash bench/ddp/recovery_churn.sh [FAILURES] [STEPS] [DIR]   # from the repository root, after a build
# Environment: IDIST_RUN and RECOVER_CHECK (the binaries; default: build/'s), CHURN_PLOT=0 (no
# plot), CHURN_HEARTBEAT (idist-run's --heartbeat-timeout; default 1), CHURN_GAP (the mean time
# between two failures; default 2 s), CHURN_PAUSE_MS (the pace of the run with failures: a sleep
# in each step, default 20; the references are not paced: the pause changes no result). At a
# failure every second on 2 cores, losses come faster than replacements start (libtorch's load):
# every member of the job is lost at times, and idist-run restarts the attempt from the last
# checkpoint, as it should, rather than go on. CHURN_DROPOUT (default 0.1): at 0, the runs differ
# only by the order of the reductions, and agree to about 1e-4 (with dropout, each world draws
# its own masks: 0.1-0.3 apart after 1,000 steps). Which world moves the sum most depends on
# the BLAS: with OpenBLAS, 1 process and 4 ranks of 16 samples agree to 1e-9 (the same
# accumulation order), 3 ranks (22, 21 and 21 samples, weighted) are 1.2e-4 away.
set -euo pipefail
cd "$(dirname "$0")/../.."
failures=${1:-20}
steps=${2:-1200}
dir=${3:-$(mktemp -d)}
RUN=${IDIST_RUN:-build/apps/idist-run/idist-run}
CHECK=${RECOVER_CHECK:-build/tests/torch/recover_check}
[[ -x $CHECK ]] || { echo "recovery_churn.sh: no $CHECK: build with idist::torch (scripts/setup.sh)" >&2; exit 1; }
export OMP_NUM_THREADS=1
mlp=(--width 256 --samples 4096 --batch 64 --recover --between-ms 0 --print-loss --dropout "${CHURN_DROPOUT:-0.1}")
gap=${CHURN_GAP:-2}  # the mean time between two failures, in seconds (a quarter of it either way)

# The running ranks of idist-run JOB: its children not stopped.
ranks_of() {
  local p
  for p in $(pgrep -P "$1"); do
    [[ $(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) == [RS] ]] && echo "$p"
  done
}

rm -rf "$dir/ck" "$dir/ref" "$dir/three" "$dir/two" "$dir/one"
"$RUN" -n 4 --max-restarts "$failures" --heartbeat-timeout "${CHURN_HEARTBEAT:-1}" "$CHECK" "$dir/ck" "$steps" "${mlp[@]}" \
  --pause-ms "${CHURN_PAUSE_MS:-20}" >"$dir/churn.out" 2>&1 &
job=$!
sleep 3  # the ranks start, and train a little
kills=0 stops=0
for i in $(seq "$failures"); do
  sleep "$(awk -v r=$RANDOM -v g="$gap" 'BEGIN { printf "%.2f", g * (0.75 + r / 65534) }')"  # 1.5-2.5 s apart by default
  mapfile -t pids < <(ranks_of $job)
  ((${#pids[@]} > 0)) || break
  victim=${pids[RANDOM % ${#pids[@]}]}
  if ((RANDOM % 4 == 0)); then
    kill -STOP "$victim" 2>/dev/null && stops=$((stops + 1))
  else
    kill -9 "$victim" 2>/dev/null && kills=$((kills + 1))
  fi
done
rc=0
wait $job || rc=$?
"$RUN" -n 4 "$CHECK" "$dir/ref" "$steps" "${mlp[@]}" >"$dir/ref.out" 2>&1
"$RUN" -n 3 "$CHECK" "$dir/three" "$steps" "${mlp[@]}" >"$dir/three.out" 2>&1
"$RUN" -n 2 "$CHECK" "$dir/two" "$steps" "${mlp[@]}" >"$dir/two.out" 2>&1
"$RUN" -n 1 "$CHECK" "$dir/one" "$steps" "${mlp[@]}" >"$dir/one.out" 2>&1
echo "# injected: $kills kill -9, $stops SIGSTOP; idist-run exit $rc"
grep -E "^idist-run: (succeeded|attempt|exit)" "$dir/churn.out" | tail -2 || true
python3 - "$dir" "$steps" "$kills" "$stops" "$rc" <<'PY'
import re, sys
d, steps = sys.argv[1], int(sys.argv[2])
injected, rc = int(sys.argv[3]) + int(sys.argv[4]), int(sys.argv[5])
def read(name):
    text = open(f"{d}/{name}.out").read()
    done = re.search(r"^recover_check: done steps=(\d+) redone=(\d+) resumed_from=\d+ seen=(\d+) params=(\S+)", text, re.M)
    loss = {int(s): float(v) for s, v in re.findall(r"^loss (\d+) (\S+)", text, re.M)}
    return text, done, loss
churn, done, loss = read("churn")
_, ref_done, ref_loss = read("ref")
others = {n: read(name)[1:] for n, name in ((3, "three"), (2, "two"), (1, "one"))}
if not done:
    print(f"# churn: injected={injected} exit={rc} steps=0 (the run did not finish: see {d}/churn.out)")
    sys.exit(1)
reforms = len(re.findall(r"^recovered: ", churn, re.M))
replaced = len(re.findall(r"starts in rank \d+'s place", churn))
print(f"| steps | re-forms | replacements | redone | seen (of {steps * 64}) |")
print("|---|---|---|---|---|")
print(f"| {done.group(1)} | {reforms} | {replaced} | {done.group(2)} | {done.group(3)} |")
p, p_ref = float(done.group(4)), float(ref_done.group(4))
p_other = {n: float(o[0].group(4)) for n, o in others.items()}
tolerance = max(abs(v - p_ref) for v in p_other.values())
last = max(loss)
print(f"\n| run | parameters' sum | final loss |\n|---|---|---|")
print(f"| 4 ranks, {reforms} re-forms | {p:.9g} | {loss[last]:.6f} |")
print(f"| 4 ranks, no failure | {p_ref:.9g} | {ref_loss[last]:.6f} |")
for n, (o_done, o_loss) in others.items():
    print(f"| {n} {'process' if n == 1 else 'ranks'}, no failure | {p_other[n]:.9g} | {o_loss[last]:.6f} |")
print(f"\n# |with failures - without| = {abs(p - p_ref):.3g}; |N processes - 4 ranks| = "
      + ", ".join(f"{abs(v - p_ref):.3g} (N={n})" for n, v in p_other.items()))
with open(f"{d}/loss.tsv", "w") as f:
    for s in sorted(ref_loss):
        f.write(f"{s}\t{loss.get(s, float('nan'))}\t{ref_loss[s]}\n")
print(f"# churn: injected={injected} exit={rc} steps={done.group(1)} reforms={reforms} replaced={replaced} "
      f"redone={done.group(2)} seen={done.group(3)} samples={steps * 64} diff={abs(p - p_ref):.6g} "
      f"tolerance={tolerance:.6g}")
PY
if [[ ${CHURN_PLOT:-1} != 0 ]] && command -v gnuplot >/dev/null; then
  gnuplot <<EOF
set terminal pngcairo size 800,360 font ',10' noenhanced
set output 'docs/bench-recovery-churn.png'
set xlabel 'step'; set ylabel 'training loss (mean of the ranks)'; set key top right
set title '4 ranks, $steps steps: $kills kill -9 + $stops SIGSTOP at random, each rank replaced (bench/ddp/recovery_churn.sh)'
plot '$dir/loss.tsv' using 1:3 with lines lw 2 title 'no failure', '' using 1:2 with lines title '$((kills + stops)) failures'
EOF
  echo "# docs/bench-recovery-churn.png"
fi
