#!/bin/bash
# The tutorial examples through idist-run, on 3 gloo ranks: what every rank prints.
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

out=$("$EX/all_reduce" 2>&1)
check "without idist-run: a world of one" contains "$out" "Rank 0, After performing all_reduce: [1, 2]"

finish
