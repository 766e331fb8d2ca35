#!/bin/bash
# The examples through idist-run, on gloo ranks: what every rank prints.
# usage: examples.sh IDIST_RUN EXAMPLES_DIR
source "$(dirname "$0")/lib.sh"
RUN=$1
EX=$2

out=$("$RUN" -n 3 "$EX/all_reduce" 2>&1)
check "all_reduce exits 0" equals $? 0
for r in 0 1 2; do
  check "all_reduce rank $r initial [$((1 + 2 * r)), $((2 + 2 * r))]" contains "$out" "Rank $r, Initial value: [$((1 + 2 * r)), $((2 + 2 * r))]"
  check "all_reduce rank $r gets [9, 12]" contains "$out" "Rank $r, After performing all_reduce: [9, 12]"
done
check "all_reduce prints 6 lines" equals "$(wc -l <<<"$out")" 6

out=$("$RUN" -n 3 "$EX/all_gather" 2>&1)
check "all_gather exits 0" equals $? 0
for r in 0 1 2; do
  check "all_gather rank $r initial $((2 * r)).0" contains "$out" "Rank $r, Initial value: $((2 * r)).0"
  check "all_gather rank $r gets [0.0, 2.0, 4.0]" contains "$out" "Rank $r, After performing all_gather: [0.0, 2.0, 4.0]"
done

out=$("$RUN" -n 3 "$EX/broadcast" 2>&1)
check "broadcast exits 0" equals $? 0
for r in 0 1 2; do
  check "broadcast rank $r initial" contains "$out" "Rank $r, Initial value: hello from rank $r"
  check "broadcast rank $r gets rank 0's message" contains "$out" "Rank $r, After performing broadcast: hello from rank 0"
done

out=$("$RUN" -n 3 "$EX/barrier" 2>&1)
check "barrier exits 0" equals $? 0
check "only local rank 0 downloads" equals "$(count "$out" "downloaded the dataset")" 1
for r in 0 1 2; do
  check "barrier rank $r reads the dataset" contains "$out" "Rank $r, loaded the dataset: 1000 samples"
done
download_line=$(grep -nF "Rank 0, downloaded" <<<"$out" | cut -d: -f1)
first_other=$(grep -nE "Rank [12], loaded" <<<"$out" | head -1 | cut -d: -f1)
check "the others read only after the download" test "${download_line:-99}" -lt "${first_other:-0}"

out=$("$RUN" -n 3 --tag-output "$EX/all_reduce" 2>&1)
check "--tag-output: every line carries its own rank" \
  equals "$(grep -cE '^\[rank ([0-2])\] Rank \1, ' <<<"$out")" 6

# "Pytorch - 3 Distributed Computing": point-to-point from rank 0 to rank 1.
out=$("$RUN" -n 2 "$EX/send_recv" 2>&1)
check "send_recv exits 0" equals $? 0
check "send_recv: rank 0 has data 1.0" contains "$out" "Rank 0 has data 1.0"
check "send_recv: rank 1 received 1.0" contains "$out" "Rank 1 has data 1.0"
out=$("$RUN" -n 3 "$EX/isend_irecv" 2>&1)
check "isend_irecv exits 0" equals $? 0
check "isend_irecv: rank 0 started sending" contains "$out" "Rank 0 started sending"
check "isend_irecv: rank 1 started receiving" contains "$out" "Rank 1 started receiving"
check "isend_irecv: rank 1 received 1.0 after wait()" contains "$out" "Rank 1 has data 1.0"
check "isend_irecv: rank 2 took no part" contains "$out" "Rank 2 has data 0.0"
out=$("$RUN" -n 1 "$EX/send_recv" 2>&1)
check "send_recv on one rank: a clear error, not a hang" contains "$out" "dst=1 is not a rank (world size 1)"

# "Pytorch - 3 Distributed Computing": all_reduce within new_group({0, 1}).
out=$("$RUN" -n 3 "$EX/group_all_reduce" 2>&1)
check "group_all_reduce exits 0" equals $? 0
check "group_all_reduce: rank 0 in the group sums to 2.0" contains "$out" "Rank 0 has data 2.0"
check "group_all_reduce: rank 1 in the group sums to 2.0" contains "$out" "Rank 1 has data 2.0"
check "group_all_reduce: rank 2 outside keeps 1.0" contains "$out" "Rank 2 has data 1.0"

# Synchronous SGD with DistributedSampler + GradientAverager equals single-process training.
out=$("$RUN" -n 1 "$EX/distributed_sgd" 2>&1)
check "distributed_sgd on 1 rank exits 0" equals $? 0
check "distributed_sgd on 1 rank matches the reference" \
  test "$(grep -c 'distributed_sgd: 1 rank, 50 steps, max |w - w_ref| = .* (ok)$' <<<"$out")" -eq 1
out=$("$RUN" -n 4 "$EX/distributed_sgd" 2>&1)
check "distributed_sgd on 4 ranks exits 0" equals $? 0
check "distributed_sgd on 4 ranks: 12 samples per rank" contains "$out" "global batch 48 = 4 ranks x 12, 2 gradient buffers, 1 all_reduce per step"
check "distributed_sgd on 4 ranks matches the reference" \
  test "$(grep -c 'distributed_sgd: 4 ranks, 50 steps, max |w - w_ref| = .* (ok)$' <<<"$out")" -eq 1
check "local_rank_first: one rank generates the dataset" equals "$(count "$out" "generated the dataset")" 1
check "local_rank_first: three ranks load the cache" equals "$(count "$out" "loaded the cached dataset")" 3
check "local_rank_first: rank 0 generates before anyone loads" \
  test "$(grep -n 'generated the dataset' <<<"$out" | cut -d: -f1)" -lt "$(grep -n 'loaded the cached' <<<"$out" | head -1 | cut -d: -f1)"
out=$("$RUN" -n 5 "$EX/distributed_sgd" 2>&1)
check "distributed_sgd on 5 ranks: a clear error" contains "$out" "the global batch of 48 does not split evenly over 5 ranks"

# The DDP metric test pattern: distributed metric == metric on all_gather'ed data.
out=$("$RUN" -n 3 "$EX/metric_check" 2>&1)
check "metric_check exits 0" equals $? 0
# 100 + 117 + 134 samples, per rank 100 + 17 r
check "metric_check: every rank agrees with the gathered reference" equals "$(grep -cE '^Rank [0-2], 351 samples: .* \(ok\)$' <<<"$out")" 3

# write_preds_to_file: gather to rank 0, which writes; every rank finds its rows.
preds=$(mktemp)
out=$("$RUN" -n 3 "$EX/write_preds" "$preds" 2>&1)
check "write_preds exits 0" equals $? 0
check "write_preds: rank 0 wrote 12" contains "$out" "Rank 0 wrote 12 predictions to $preds"
check "write_preds: 12 lines in the file" equals "$(wc -l <"$preds")" 12
for r in 0 1 2; do
  check "write_preds: rank $r found its predictions" contains "$out" "Rank $r found 4 of its 4 predictions"
  for i in 0 1 2 3; do
    s=$((4 * r + i))
    check "write_preds: sample $s of rank $r in the file" grep -qx "$s,$r,$((s * 7 % 10))" "$preds"
  done
done
rm -f "$preds"

# compute_metric: all_gather, rank 0 computes, broadcast. Samples 0..9, wrong on 0, 3, 6, 9.
out=$("$RUN" -n 2 "$EX/compute_metric" 2>&1)
check "compute_metric exits 0" equals $? 0
for r in 0 1; do
  check "compute_metric: rank $r has rank 0's accuracy 0.6" contains "$out" "Rank $r, accuracy over 10 samples: 0.6"
done

out=$("$EX/all_reduce" 2>&1)
check "without idist-run: a world of one" contains "$out" "Rank 0, After performing all_reduce: [1, 2]"

# CI smoke on CPU: a program that asks for nccl runs every collective over gloo when told to.
for n in 2 3; do
  out=$("$RUN" -n $n --backend gloo "$EX/smoke" 2>&1)
  check "smoke (asks for nccl) under --backend gloo on $n ranks: exit 0" equals $? 0
  check "... every rank's collectives right" equals "$(count "$out" "on gloo: every collective right")" $n
  check "... and one notice of the override" equals "$(count "$out" "IDIST_BACKEND=gloo overrides the backend 'nccl'")" 1
done
if ! command -v nvidia-smi >/dev/null; then
  out=$("$RUN" -n 2 "$EX/smoke" 2>&1)
  rc=$?
  check "smoke without --backend on a machine without a GPU: fails at init, saying nccl" \
    eval '[ $rc -ne 0 ] && contains "$out" "init(nccl)"'
fi

finish
