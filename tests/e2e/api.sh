#!/bin/bash
# The typed public API on 1, 2 and 4 ranks, and with no launcher at all.
# usage: api.sh IDIST_RUN API_CHECK
source "$(dirname "$0")/lib.sh"
RUN=$1
API=$2

for n in 1 2 4; do
  out=$("$RUN" -n $n "$API" 2>&1)
  check "api_check on $n rank(s) exits 0" equals $? 0
  check "api_check on $n rank(s): every rank passed" equals "$(grep -cE "^api_check rank [0-9]+/$n: [0-9]+ checks, 0 failed$" <<<"$out")" $n
done
out=$("$RUN" -n 2 --backend gloo "$API" 2>&1)
check "--backend gloo works" equals $? 0
out=$(env -u RANK -u WORLD_SIZE "$API" 2>&1)
check "api_check with no launcher: a world of one" contains "$out" "api_check rank 0/1: "
# nccl: not built here, or built but without a GPU; either way a clear error at init.
out=$(IDIST_BACKEND=nccl "$RUN" -n 2 "$API" 2>&1)
echo "$out" | grep -m1 "init(nccl)"
if contains "$("$RUN" --version)" "nccl"; then
  check "nccl without a GPU fails at init, saying so" contains "$out" "init(nccl): "
else
  check "a backend not built in fails at init" contains "$out" "init(nccl): backend 'nccl' is not installed: no libidist-backend-nccl.so"
fi
out=$("$RUN" -n 2 --backend mpi "$API" 2>&1)
check "--backend mpi with spawned ranks is refused up front (exit 2)" equals "$?" 2
check "... pointing at mpirun" contains "$out" "mpirun -np 2 idist-run --backend mpi"

# A rank that never joins: the others raise TimeoutError within IDIST_TIMEOUT, no hang.
start=$(now_ms)
out=$(RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$(random_port) IDIST_TIMEOUT=1 "$API" 2>&1)
rc=$?
check "rank 0 alone: init fails" test $rc -ne 0
check "rank 0 alone: the error says so" contains "$out" "[idist rank 0/2] init(gloo): "
check "rank 0 alone: within the timeout" test $(($(now_ms) - start)) -lt 10000

finish
