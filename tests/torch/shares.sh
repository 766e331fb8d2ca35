#!/bin/bash
# A global batch the world size does not divide (shares_check.cpp): 64 on 3 ranks (22, 21, 21)
# and 50 on 4 (13, 13, 12, 12) train to the parameters and loss of one process with the same
# batch, as 64 on 2 ranks (divisible) does, to float32's rounding of another reduction order
# (1e-6 relative; 2-6e-8 measured). A batch smaller than the world is refused in one line.
# usage: shares.sh IDIST_RUN SHARES_CHECK
source "$(dirname "$0")/../e2e/lib.sh"
RUN=$(realpath "$1")
CHECK=$(realpath "$2")

field() { grep -o "$2=[^ ]*" <<<"$1" | head -1 | cut -d= -f2; }
# close A B: |A - B| <= 1e-6 x max(|A|, 1)
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; if (m < 1) m = 1; exit !(a != "" && d <= 1e-6 * m) }'; }

for case in "64 2" "64 3" "50 4"; do
  set -- $case
  batch=$1 n=$2
  one=$("$CHECK" 12 "$batch" 2>&1)
  many=$("$RUN" -n "$n" "$CHECK" 12 "$batch" 2>&1)
  echo "1 rank:   $one"
  echo "$n ranks: $many"
  check "batch $batch on $n ranks: rank 0's share" equals "$(field "$many" share)" $(((batch + n - 1) / n))
  check "... the parameters of one process with batch $batch" close "$(field "$many" params)" "$(field "$one" params)"
  check "... and its loss" close "$(field "$many" loss)" "$(field "$one" loss)"
done

out=$("$RUN" -n 3 "$CHECK" 2 2 2>&1)
check "a batch of 2 on 3 ranks is refused, naming both" contains "$out" \
  "auto_dataloader(gloo): batch_size 2 is smaller than the world size 3"
finish
