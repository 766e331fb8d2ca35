#!/bin/bash
# idist::Checkpoint (checkpoint_check.cpp): a job whose last rank is killed (SIGKILL) mid-epoch
# and restarted by idist-run --max-restarts resumes at the last save and ends with the
# parameters of a run never killed, bit for bit, having used each step's samples once; over
# shared memory at 2 and 3 ranks and TCP at 2. Then: a damaged newest checkpoint is skipped, a
# directory that cannot be made is refused in one line, and how long save() blocks against a
# copy by hand (printed, not judged: the machines are noisy).
# usage: checkpoint.sh IDIST_RUN CHECKPOINT_CHECK
source "$(dirname "$0")/../e2e/lib.sh"
RUN=$(realpath "$1")
CHECK=$(realpath "$2")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

field() { grep -o "$2=[^ ]*" <<<"$1" | head -1 | cut -d= -f2; }

# 30 steps, a save every 4, 8 steps an epoch: the kill at step 14 falls in epoch 2, after the
# save at step 12 (4 of its 8 batches done).
for config in "shm 2" "shm 3" "off 2"; do
  set -- $config
  transport=$1 n=$2
    label="$n ranks, IDIST_INTRANODE=$transport"
    export IDIST_INTRANODE=$transport
    whole=$("$RUN" -n "$n" "$CHECK" train "$TMP/whole-$transport-$n" 30 4 2>&1)
    check "$label: a run never killed ends" contains "$whole" "done steps=30 resumed_from=0" || echo "$whole"
    killed=$("$RUN" -n "$n" --max-restarts 1 "$CHECK" train "$TMP/killed-$transport-$n" 30 4 14 2>&1)
    rc=$?
    echo "$killed" | grep -E "idist-run|done"
    check "$label: killed at step 14 and restarted: exit 0" equals "$rc" 0
    check "... resumed at the save of step 12" equals "$(field "$killed" resumed_from)" 12
    check "... used the samples of steps 13-30 once (18 x 12)" equals "$(field "$killed" seen)" 216
    check "... parameters equal to the run never killed, bit for bit" equals \
      "$(field "$killed" params)" "$(field "$whole" params)"
    check "... the newest 2 checkpoints kept" equals "$(ls "$TMP/killed-$transport-$n" | tr '\n' ' ')" \
      "checkpoint_24.pt checkpoint_28.pt "
done
unset IDIST_INTRANODE

# Resumed at another world size (an elastic job that lost or gained ranks): the place in the
# epoch is kept as samples of all ranks together. 12 per global batch: 2 ranks 6 each, 5 ranks
# shares of 3, 3, 2, 2, 2 (weighed by auto_model): the same global batches, so the parameters
# of the 2-rank run never killed, to float32's rounding of another reduction order.
dir="$TMP/resized"
"$RUN" -n 2 "$CHECK" train "$dir" 30 4 14 >/dev/null 2>&1
out=$("$RUN" -n 5 "$CHECK" train "$dir" 30 4 2>&1)
echo "$out" | grep done
check "killed on 2 ranks at step 14, resumed on 5: at step 12" equals "$(field "$out" resumed_from)" 12
check "... the samples of steps 13-30 once" equals "$(field "$out" seen)" 216
whole=$(field "$("$RUN" -n 2 "$CHECK" train "$TMP/whole-resized" 30 4 2>&1)" params)
check "... the parameters of the 2-rank run never killed (1e-6)" awk -v a="$(field "$out" params)" -v b="$whole" \
  'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b != "" && d <= 1e-6 * (b < 0 ? -b : b)) }'

# A damaged newest checkpoint (a crash cannot leave one, a disk can) is skipped, saying so.
dir="$TMP/killed-shm-2"
printf 'not a checkpoint' >"$dir/checkpoint_32.pt"
out=$("$RUN" -n 2 "$CHECK" train "$dir" 36 4 2>&1)
echo "$out"
check "a damaged newest checkpoint: skipped with one line naming it" contains "$out" \
  "checkpoint: skipping $dir/checkpoint_32.pt, which does not load"
check "... and the one before it loaded" equals "$(field "$out" resumed_from)" 28

# A directory that cannot be made: one line, exit 1, before any training.
out=$("$CHECK" train /etc/passwd/checkpoints 8 4 2>&1)
rc=$?
echo "$out"
check "a directory that cannot be made: exit 1" equals "$rc" 1
check "... in one line naming it" equals "$out" \
  "checkpoint_check: [idist rank 0/1] checkpoint(gloo): cannot create the directory /etc/passwd/checkpoints: Not a directory"

# How long save() blocks the step, against copying the same state by hand.
for width in 1024 2048; do "$CHECK" blocking "$TMP/blocking-$width" "$width"; done

finish
