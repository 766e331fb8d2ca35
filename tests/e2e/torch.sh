#!/bin/bash
# PyTorch scripts run unchanged: torch.distributed with init_method="env://" and gloo, under
# idist-run, with torchrun's spellings, -m and --no-python; Debian's python3-torch.
# usage: torch.sh IDIST_RUN                 exits 77 (skipped) when python3-torch is missing
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
SCRIPT=$(cd "$(dirname "$0")" && pwd)/python/torch_all_reduce.py
PY=/usr/bin/python3
if ! "$PY" -c "import torch.distributed" 2>/dev/null; then
  echo "SKIP: $PY cannot import torch.distributed (scripts/setup.sh installs python3-torch)"
  exit 77
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
# idist-run runs a .py program and -m under the python3 in PATH, as torchrun under its own.
export PATH=/usr/bin:$PATH
cp "$SCRIPT" plain.py  # not executable
{ echo "#!$PY"; cat "$SCRIPT"; } >exe.py && chmod +x exe.py
mkdir -p pkg && cp "$SCRIPT" pkg/train.py && touch pkg/__init__.py

# every_rank_right OUT N WHAT: every one of N ranks printed the right sum.
every_rank_right() {
  local r ok=0
  for r in $(seq 0 $(($2 - 1))); do
    contains "$1" "Rank $r/$2 " && contains "$(grep "Rank $r/$2 " <<<"$1")" "right" || ok=1
  done
  [ "$(count "$1" "right")" = "$2" ] || ok=1
  [ $ok = 0 ] || echo "$1" | tail -15 | sed 's/^/  | /'
  return $ok
}

out=$("$RUN" -n 3 "$PY" "$SCRIPT" --lr 0.1 2>&1)
check "idist-run -n 3 python3 script.py: exit 0" equals $? 0
check "... every rank gets [9, 12]" every_rank_right "$out" 3
check "... the script's own options reach it" contains "$out" "args ['--lr', '0.1']"

port=$((10000 + RANDOM % 10000))
out=$("$RUN" --nproc_per_node 2 --nnodes 1 --node_rank 0 --master_addr 127.0.0.1 --master_port $port plain.py 2>&1)
check "torchrun's spellings (--nproc_per_node --nnodes --node_rank --master_addr --master_port) and a .py run by python3" \
  every_rank_right "$out" 2
out=$("$RUN" --nproc-per-node 2 plain.py 2>&1)
check "--nproc-per-node 2 plain.py" every_rank_right "$out" 2

out=$("$RUN" --nproc-per-node 2 -m pkg.train --epochs 3 2>&1)
check "-m pkg.train runs the module under python3, as python -m" every_rank_right "$out" 2
check "... with its arguments" contains "$out" "args ['--epochs', '3']"

out=$("$RUN" -n 2 --no-python ./exe.py 2>&1)
check "--no-python ./exe.py runs it directly" every_rank_right "$out" 2
err=$("$RUN" -n 2 --no-python -m pkg.train 2>&1 >/dev/null)
rc=$?
check "--no-python with -m: exit 2, one line" eval '[ $rc = 2 ] && [ "$(wc -l <<<"$err")" = 1 ]'
check "... saying why: $err" contains "$err" "--no-python"

out=$("$RUN" -n 2 -m no_such_module_xyz 2>&1)
rc=$?
check "-m of a missing module: the job fails (exit $rc) naming the module" \
  eval '[ $rc -ne 0 ] && contains "$out" "No module named no_such_module_xyz"'

# A script written for torch.distributed.launch without --use-env (argparse --local_rank),
# unchanged: --local-rank-arg passes --local_rank=N between the script and its arguments, as
# torch 1.13's launcher does (torch/distributed/run.py); Debian's launcher itself fails here
# under Python 3.11, so the reference is its code, not a run.
cp "$(dirname "$SCRIPT")/torch_local_rank_arg.py" lr.py
out=$("$RUN" --local-rank-arg -n 2 lr.py --epochs 3 2>&1)
check "--local-rank-arg -n 2 lr.py --epochs 3: exit 0" equals $? 0
check "... rank 0 is told --local_rank=0" contains "$out" "rank 0: --local_rank=0 epochs=3"
check "... rank 1 is told --local_rank=1" contains "$out" "rank 1: --local_rank=1 epochs=3"
check "... both sum 1 + 2" equals "$(count "$out" "local ranks + 1: 3")" 2 || echo "$out" | tail -4
out=$("$RUN" -n 2 lr.py 2>&1)
check "without --local-rank-arg both ranks take the default 0 (what the option is for)" \
  equals "$(count "$out" "local ranks + 1: 2")" 2
mkdir -p pkg_lr && cp lr.py pkg_lr/train.py && touch pkg_lr/__init__.py
out=$(IDIST_LOCAL_RANK_ARG=1 "$RUN" -n 2 -m pkg_lr.train --epochs 2 2>&1)
check "IDIST_LOCAL_RANK_ARG=1 with -m pkg.train: --local_rank=N after the module" \
  equals "$(count "$out" "epochs=2 sum of local ranks + 1: 3")" 2

# Two "nodes" on loopback, as torchrun's static rendezvous: 4 ranks, node-major.
port=$((10000 + RANDOM % 10000))
"$RUN" --nnodes 2 --node_rank 1 --master_addr 127.0.0.1 --master_port $port --rdzv_id t$port --nproc_per_node 2 plain.py >node1.out 2>&1 &
out=$("$RUN" --nnodes 2 --node_rank 0 --master_addr 127.0.0.1 --master_port $port --rdzv_id t$port --nproc_per_node 2 plain.py 2>&1)
wait $!
check "two nodes of 2 (--nnodes 2 --node_rank 0/1 --rdzv_id): every rank of 4 right" every_rank_right "$(printf '%s\n%s' "$out" "$(cat node1.out)")" 4

finish
