#!/bin/bash
# idist::spawn and idist::Parallel (the tutorial's own entry points) from a program's side:
# the *_spawn examples started plainly (they start their ranks) and under idist-run, a real
# mpirun and a real MPICH Hydra (they only initialise); every tutorial collective on 1, 2 and
# 3 ranks; a rank that throws, exits 3 or is killed, each reaching the caller as SpawnError
# naming it, with nothing left behind; spawn twice in a row; a caller with a second thread;
# Parallel in place, spawning, and under launchers (no second spawn). srun: slurm.sh.
# usage: spawn.sh IDIST_RUN EXAMPLES_DIR SPAWN_CHECK
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
EX=$(realpath "$2")
CHECK=$(realpath "$3")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

# tutorial OUT WHAT N EXAMPLE: the tutorial's "After performing" line, once per rank 0..N-1.
tutorial() {
  local out=$1 what=$2 n=$3 example=$4 r want
  case $example in
    all_reduce) want="[$((n * n)), $((n * n + n))]" ;;
    all_gather) want="[0.0, 2.0, 4.0]" ;;
    broadcast) want="hello from rank 0" ;;
  esac
  for r in $(seq 0 $((n - 1))); do
    check "$what: rank $r: $want" contains "$out" "Rank $r, After performing $example: $want"
  done
  check "$what: exactly $n ranks (no second spawn)" equals "$(count "$out" "After performing")" "$n" ||
    echo "$out" | tail -12 | sed 's/^/  | /'
}

# ---------------------------------------------------------------- the examples, as the tutorial
for example in all_reduce all_gather broadcast; do
  out=$(timeout 60 "$EX/${example}_spawn" 2>&1)
  check "${example}_spawn run plainly exits 0" equals $? 0
  tutorial "$out" "${example}_spawn plainly" 3 $example
  check "${example}_spawn plainly: each rank's initial value" contains "$out" "Rank 2, Initial value:"
done

out=$(timeout 60 "$RUN" -n 3 "$EX/all_reduce_spawn" 2>&1)
check "idist-run -n 3 all_reduce_spawn exits 0" equals $? 0
tutorial "$out" "idist-run -n 3 all_reduce_spawn" 3 all_reduce

out=$(timeout 60 "$RUN" -n 2 "$EX/all_reduce_spawn" 2>&1)
check "idist-run -n 2 all_reduce_spawn (nproc_per_node=3) fails" test $? -ne 0
check "the refusal names nproc_per_node and the 2 ranks idist-run started" \
  contains "$out" "nproc_per_node=3, but idist-run started this process as one of 2 ranks on this node"

out=$(IDIST_NO_DETECT=1 RANK=0 WORLD_SIZE=1 timeout 60 "$EX/all_reduce_spawn" 2>&1)
check "IDIST_NO_DETECT=1 with RANK set: spawns anyway (3 ranks)" equals "$(count "$out" "After performing")" 3

# ---------------------------------------------------------------- spawn from a program
for n in 1 2 3; do
  out=$(timeout 60 "$CHECK" spawn $n 2>&1)
  check "spawn $n: exits 0" equals $? 0
  check "spawn $n: every collective right on every rank" equals "$(count "$out" "collectives ok")" $n ||
    echo "$out" | tail -5 | sed 's/^/  | /'
done

# Two spawning programs at once on this host, of different sizes: a mix would break the sums.
timeout 60 "$CHECK" spawn 2 >two.out 2>&1 &
other=$!
out=$(timeout 60 "$CHECK" spawn 3 2>&1)
wait $other
check "two spawning programs at once (2 and 3 ranks) never meet" \
  eval '[ "$(count "$out" "/3: collectives ok")" = 3 ] && [ "$(count "$(cat two.out)" "/2: collectives ok")" = 2 ]'

out=$(timeout 60 "$CHECK" twice 2>&1)
check "spawn twice in a row (2, then 3 with an argument, then 1): exits 0" equals $? 0 || echo "$out" | tail -5
check "spawn twice: 2 + 3 + 1 ranks right" equals "$(count "$out" "collectives ok")" 6
check "spawn twice: the second fn got its argument" equals "$(count "$out" "second+7:")" 3

for how in throw exit3 signal; do
  out=$(timeout 60 "$CHECK" fail $how 2>&1)
  check "a rank that fails ($how): the caller catches SpawnError and every check holds" equals $? 0 ||
    echo "$out" | grep -E "not ok|caught" | sed 's/^/  | /'
  echo "$out" | grep '^caught' | sed 's/^/# /'
done

out=$(IDIST_INTRANODE=off timeout 60 "$CHECK" mismatch 2>&1)
check "spawn after the caller's own init: ranks whose collectives do not match make spawn fail" equals $? 0 ||
  echo "$out" | tail -5
check "... naming both calls" contains "$out" "called all_reduce (int32, 2 elements)"
out=$(timeout 60 "$CHECK" fds 2>&1)
check "fn writes through a close-on-exec descriptor the caller opened" contains "$out" "fds: 2 lines"
out=$(timeout 60 "$CHECK" nosync 2>&1)
check "std::cout with sync_with_stdio(false), never flushed by fn: both ranks' lines arrive" \
  eval '[ "$(count "$out" " says hi")" = 2 ]'
out=$(timeout 60 "$CHECK" children 2>&1)
check "spawn with a child of the caller's running is refused, and the child left alone" equals $? 0
check "... naming it" contains "$out" "this process has child processes of its own (pid "

out=$(timeout 60 "$CHECK" threads 2>&1)
check "spawn with a second thread running is refused, naming why" contains "$out" "this process runs 2 threads"

# Two "nodes" without a scheduler: nnodes, node_rank, master_addr, master_port, rdzv_id.
port=$(random_port)
timeout 60 "$CHECK" node 1 $port "id$port" >node1.out 2>&1 &
out=$(timeout 60 "$CHECK" node 0 $port "id$port" 2>&1)
wait $!
check "spawn on 2 nodes x 2 (nnodes, node_rank, master_addr, master_port, rdzv_id): 4 ranks right" \
  equals "$(printf '%s\n%s' "$out" "$(cat node1.out)" | grep -c "/4: collectives ok")" 4 || cat node1.out
# A node that never comes: the nodes' rendezvous waits .timeout, then node 0 gives up before
# starting a rank, and the caller hears why.
start=$(date +%s%N)
out=$(timeout 60 "$CHECK" node 0 $((port + 1)) "id$port" 2 2>&1)
rc=$?
ms=$((($(date +%s%N) - start) / 1000000))
check "node 1 never comes, timeout 2 s: spawn throws (exit $rc) within 2-9 s ($ms ms)" \
  eval '[ $rc -ne 0 ] && [ $ms -ge 1900 ] && [ $ms -lt 9000 ]'
check "... naming the node that never came" contains "$out" "1 of 2 nodes joined ($(hostname)); node 1 never joined"

# ---------------------------------------------------------------- Parallel
out=$(timeout 60 "$CHECK" parallel 2>&1)
check "Parallel without nproc_per_node: a world of one, in the caller" contains "$out" "rank 0 in the caller's process: yes"
check "Parallel without nproc_per_node: collectives right" equals "$(count "$out" "rank 0/1: collectives ok")" 1
for n in 2 3; do
  out=$(timeout 60 "$CHECK" parallel $n 2>&1)
  check "Parallel nproc_per_node=$n: spawns $n ranks, every collective right" equals "$(count "$out" "collectives ok")" $n
  check "Parallel nproc_per_node=$n: fn runs in the ranks, not the caller" equals "$(count "$out" "caller's process: no")" $n
done

out=$(timeout 60 "$CHECK" spawn-mpi 2>&1)
rc=$?
check "spawn with backend mpi is refused (exit $rc), pointing at mpirun in spawn's words" eval \
  '[ $rc -ne 0 ] && contains "$out" "backend mpi needs its ranks started by mpirun, not by spawn: run the program under \`mpirun -np 2\`"' ||
  echo "$out" | tail -3

out=$(timeout 60 "$CHECK" parallel-doc 2>&1)
check "Parallel p({.backend = \"gloo\", .nproc_per_node = 2}) (the README's form) spawns 2" \
  equals "$(count "$out" "/2: collectives ok")" 2

# fn throws on rank 0 while rank 1 waits in a collective: the exception reaches main at once,
# not after IDIST_TIMEOUT (finalize, which waits for every rank, is skipped when unwinding).
start=$(date +%s%N)
out=$(IDIST_TIMEOUT=20 timeout 60 "$RUN" -n 2 "$CHECK" parallel-throw 2>&1)
rc=$?
ms=$((($(date +%s%N) - start) / 1000000))
check "Parallel, fn throws under idist-run: the job fails (exit $rc) in $ms ms, well before IDIST_TIMEOUT=20" \
  eval '[ $rc -ne 0 ] && [ $ms -lt 8000 ]'
check "... main caught rank 0's exception" contains "$out" "caught: rank 0 gives up"

out=$(timeout 60 "$RUN" -n 3 "$CHECK" parallel 2>&1)
check "idist-run -n 3 Parallel: exits 0" equals $? 0
check "idist-run -n 3 Parallel: 3 ranks, each fn in its own process (no second spawn)" \
  equals "$(count "$out" "caller's process: yes")" 3
check "idist-run -n 3 Parallel: collectives right over 3" equals "$(count "$out" "/3: collectives ok")" 3

out=$(timeout 60 "$RUN" -n 2 "$CHECK" parallel 2 2>&1)
check "idist-run -n 2 Parallel(nproc_per_node=2) is refused (as ignite's)" test $? -ne 0
check "the refusal says the launcher decides" contains "$out" "are the launcher's to decide"

# torchrun's environment, set by hand: Debian's torchrun itself fails under Python 3.11 before
# starting anything (its Std enum, torch/distributed/elastic/multiprocessing/api.py).
port=$(random_port)
torchrun_env() { env RANK=$1 WORLD_SIZE=2 LOCAL_RANK=$1 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 MASTER_ADDR=127.0.0.1 \
  MASTER_PORT=$port TORCHELASTIC_RUN_ID=t$port "${@:2}"; }
torchrun_env 1 timeout 60 "$CHECK" parallel >rank1.out 2>&1 &
rank1=$!
out=$(torchrun_env 0 timeout 60 "$CHECK" parallel 2>&1)
wait $rank1
out=$(printf '%s\n%s' "$out" "$(cat rank1.out)")
check "torchrun's env: Parallel initialises in place on both ranks" equals "$(count "$out" "caller's process: yes")" 2
check "torchrun's env: collectives right over 2" equals "$(count "$out" "/2: collectives ok")" 2 || echo "$out" | tail -4

# ---------------------------------------------------------------- real MPI launchers, no idist-run
if command -v mpirun >/dev/null; then
  MPIRUN=(timeout 60 mpirun --allow-run-as-root --oversubscribe)
  out=$("${MPIRUN[@]}" -np 3 "$EX/all_reduce_spawn" 2>&1)
  check "mpirun -np 3 all_reduce_spawn exits 0" equals $? 0
  tutorial "$out" "mpirun -np 3 all_reduce_spawn" 3 all_reduce
  out=$("${MPIRUN[@]}" -np 1 "$EX/all_reduce_spawn" 2>&1)
  tutorial "$out" "mpirun -np 1 all_reduce_spawn (3 started by the task)" 3 all_reduce
  out=$("${MPIRUN[@]}" -np 3 "$CHECK" parallel 2>&1)
  check "mpirun -np 3 Parallel: fn in each task's own process" equals "$(count "$out" "caller's process: yes")" 3
  check "mpirun -np 3 Parallel: collectives right over 3" equals "$(count "$out" "/3: collectives ok")" 3
else
  echo "# SKIP: mpirun (Open MPI) not installed"
fi
if command -v mpiexec.hydra >/dev/null; then
  for mode in "" -pmi-port; do
    out=$(timeout 60 mpiexec.hydra $mode -n 3 "$EX/all_gather_spawn" 2>&1)
    check "mpiexec.hydra $mode -n 3 all_gather_spawn exits 0" equals $? 0
    tutorial "$out" "mpiexec.hydra $mode -n 3 all_gather_spawn" 3 all_gather
  done
  out=$(timeout 60 mpiexec.hydra -n 3 "$CHECK" parallel 2>&1)
  check "mpiexec.hydra -n 3 Parallel: collectives right over 3, in place" equals "$(count "$out" "caller's process: yes")" 3
else
  echo "# SKIP: mpiexec.hydra (MPICH) not installed"
fi

finish
