#!/bin/bash
# What idist-run does with the program it starts, by the kind of program: a Python interpreter
# named on the command line (--local-rank-arg after the script, output not held back) and an
# MPI program (refused when spawned, with the command that works; run under mpirun).
# usage: programs.sh IDIST_RUN EXAMPLES_DIR
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
EX=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP" || exit 1

echo "# python3 named on the command line, with --local-rank-arg (as torch.distributed.launch)"
cat >train.py <<'EOF'
import argparse, os
parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, required=True)
parser.add_argument("--epochs", type=int)
args = parser.parse_args()
assert args.local_rank == int(os.environ["LOCAL_RANK"]), (args.local_rank, os.environ["LOCAL_RANK"])
print(f"local_rank {args.local_rank} epochs {args.epochs}")
EOF
mkdir -p pkg && cp train.py pkg/train.py && touch pkg/__init__.py
for form in "$(command -v python3) train.py" "python3 -u train.py" "python3 -m pkg.train"; do
  # shellcheck disable=SC2086 # the form is words
  out=$("$RUN" --local-rank-arg -n 2 $form --epochs 3 2>&1)
  rc=$?
  check "$form: every rank parses --local_rank=N (exit $rc)" eval \
    '[ $rc = 0 ] && contains "$out" "local_rank 0 epochs 3" && contains "$out" "local_rank 1 epochs 3"' || echo "$out"
done

echo "# python3 without -u: a rank's lines come as it prints them, not when it exits"
cat >slow.py <<'EOF'
import os, time
print("started")
for _ in range(300):  # until the test has seen the line (or 30 s)
    if os.path.exists("go"):
        break
    time.sleep(0.1)
EOF
env -u PYTHONUNBUFFERED "$RUN" -n 2 python3 slow.py >"$TMP/slow.out" 2>&1 &
job=$!
wait_for_lines "$TMP/slow.out" started 2
check "both ranks' first line is out while they still run" \
  eval '[ "$(count "$(cat "$TMP/slow.out")" started)" = 2 ] && kill -0 $job 2>/dev/null' || cat "$TMP/slow.out"
touch go
wait $job
check "... and the job exits 0" equals $? 0
out=$(PYTHONUNBUFFERED= "$RUN" -n 1 python3 -c 'import os; print(repr(os.environ["PYTHONUNBUFFERED"]))' 2>&1)
check "a PYTHONUNBUFFERED the user set stays theirs" equals "$out" "''"

echo "# a program that links libmpi, with no MPI launcher around"
if ! command -v mpicxx >/dev/null || ! command -v mpirun >/dev/null; then
  echo "# skipped: needs mpicxx and mpirun (apt-get install libopenmpi-dev openmpi-bin)"
  finish
  exit
fi
cat >mpi_prog.cpp <<'EOF'
#include <mpi.h>
#include <cstdio>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::printf("MPI rank %d of %d\n", rank, size);
  MPI_Finalize();
}
EOF
mpicxx -o mpi_prog mpi_prog.cpp || { check "mpicxx builds a tiny MPI program" false; finish; exit; }
err=$("$RUN" -n 2 ./mpi_prog 2>&1 >/dev/null)
rc=$?
check "idist-run -n 2 ./mpi_prog: refused, exit 2 ($err)" equals $rc 2
check "... in one line" equals "$(wc -l <<<"$err")" 1
check "... naming the library" contains "$err" "links libmpi"
check "... and the command that works" contains "$err" "mpirun -np 2 ./mpi_prog"
err=$("$RUN" --dry-run -n 3 ./mpi_prog 2>&1 >/dev/null)
rc=$?
check "--dry-run refuses it too" eval '[ $rc = 2 ] && contains "$err" "mpirun -np 3 ./mpi_prog"'
MPIRUN=(timeout 60 mpirun --allow-run-as-root --oversubscribe)
out=$("${MPIRUN[@]}" -np 2 "$RUN" ./mpi_prog 2>&1)
rc=$?
check "the suggested mpirun -np 2 idist-run ./mpi_prog: one world of 2" eval \
  '[ $rc = 0 ] && contains "$out" "MPI rank 1 of 2"' || echo "$out"
out=$("${MPIRUN[@]}" -np 2 ./mpi_prog 2>&1)
rc=$?
check "the suggested mpirun -np 2 ./mpi_prog: one world of 2" eval '[ $rc = 0 ] && contains "$out" "MPI rank 1 of 2"' ||
  echo "$out"
out=$("$RUN" -n 1 ./mpi_prog 2>&1)
rc=$?
check "idist-run -n 1 ./mpi_prog: one rank is a world of one, as asked" eval \
  '[ $rc = 0 ] && contains "$out" "MPI rank 0 of 1"' || echo "$out"
out=$("$RUN" -n 2 --backend gloo ./mpi_prog 2>&1)
check "idist-run -n 2 --backend gloo ./mpi_prog: the user says it is not an MPI job" equals $? 0 || echo "$out"
check "a program that links libidist (which loads MPI as a plugin) does not link libmpi" \
  eval '! readelf -d "$EX/all_reduce" | grep -q "NEEDED.*libmpi"'
out=$("$RUN" -n 2 "$EX/all_reduce" 2>&1)
rc=$?
check "... and is not refused" eval '[ $rc = 0 ] && contains "$out" "After performing all_reduce"' || echo "$out"

finish
