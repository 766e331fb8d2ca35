#!/bin/bash
# idist-run under MPICH's real Hydra (mpiexec.hydra, installed beside Open MPI): its default
# mode (PMI_FD, PMI_RANK, PMI_SIZE) and -pmi-port (only PMI_PORT and PMI_ID: rank and size come
# from the PMI server). Every job gets its own store port from the PMI server's job name, so
# two jobs at once on this host never meet: each sums its own input, with libidist and with
# torch.distributed (which checks no token). Also: MPICH programs under idist-run, launcher
# marks without a topology, and a libidist program started by mpiexec without idist-run.
# usage: hydra.sh IDIST_RUN EXAMPLES_DIR JOB_SUM      exits 77 (skipped) without mpiexec.hydra
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
EX=$(realpath "$2")
JOB_SUM=$(realpath "$3")
HERE=$(cd "$(dirname "$0")" && pwd)
if ! command -v mpiexec.hydra >/dev/null; then
  echo "SKIP: needs MPICH's mpiexec.hydra (apt-get install mpich; scripts/setup.sh does)"
  exit 77
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
HYDRA=(timeout 120 mpiexec.hydra)
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT IDIST_JOB_TOKEN
field() { grep -o "\b$2=[^ ]*" <<<"$1" | head -1 | cut -d= -f2; }

for mode in default -pmi-port; do
  flag=(); [ $mode = default ] || flag=(-pmi-port)
  out=$("${HYDRA[@]}" "${flag[@]}" -n 3 "$RUN" "$EX/all_reduce" 2>&1)
  check "mpiexec.hydra $mode -n 3 idist-run all_reduce: exit 0" equals $? 0
  check "... all 3 ranks get [9, 12] (not three worlds of one)" equals "$(count "$out" "After performing all_reduce: [9, 12]")" 3

  out=$("${HYDRA[@]}" "${flag[@]}" -n 2 "$RUN" "$HERE/ranks/print_env.sh" 2>&1)
  r1=$(grep "^RANK=1 " <<<"$out")
  check "$mode: rank 1 sees WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 IDIST_LAUNCHER=mpi" \
    equals "$(field "$r1" WORLD_SIZE) $(field "$r1" LOCAL_WORLD_SIZE) $(field "$r1" IDIST_LAUNCHER)" "2 2 mpi"
  dry=$("${HYDRA[@]}" "${flag[@]}" -n 1 "$RUN" --dry-run "$EX/all_reduce" 2>&1)
  check "$mode: --dry-run says the port comes from the PMI server's job name" \
    contains "$dry" "derived from the PMI server's job name"
done

# Two jobs at once, each mode, same size: any mixing shows as a wrong sum or a failed job.
for mode in default -pmi-port; do
  MODE=(); [ $mode = default ] || MODE=(-pmi-port)
  two_jobs "two Hydra jobs at once ($mode), libidist" "${HYDRA[@]}" "${MODE[@]}" -n 3 "$RUN" "$JOB_SUM" 40 25
  if /usr/bin/python3 -c "import torch.distributed" 2>/dev/null; then
    two_jobs "two Hydra jobs at once ($mode), torch.distributed env://" "${HYDRA[@]}" "${MODE[@]}" -n 3 "$RUN" \
      /usr/bin/python3 "$HERE/python/torch_job_sum.py"
  else
    echo "skipped: torch.distributed under two Hydra jobs ($mode): python3-torch missing"
  fi
done

# An MPICH program speaks PMI itself. With -pmi-port each connection is its own session, so
# idist-run's question leaves nothing behind; under PMI_FD, --master-port (or --rdzv-id) keeps
# idist-run from asking, and without either the program's MPI_Init fails loudly (never exit 0).
if command -v mpicc.mpich >/dev/null; then
  cat >"$TMP/hello.c" <<'C'
#include <mpi.h>
#include <stdio.h>
int main(int c, char** v) {
  MPI_Init(&c, &v);
  int r, s, x, y;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  x = r + 1;
  MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  printf("mpich rank %d/%d sum %d\n", r, s, y);
  MPI_Finalize();
  return 0;
}
C
  if mpicc.mpich "$TMP/hello.c" -o "$TMP/hello" 2>"$TMP/cc.err"; then
    out=$("${HYDRA[@]}" -pmi-port -n 3 "$RUN" "$TMP/hello" 2>&1)
    check "MPICH program under -pmi-port idist-run: exit 0, every rank sums 6" \
      eval '[ $? = 0 ] && [ "$(count "$out" "sum 6")" = 3 ]'
    out=$("${HYDRA[@]}" -n 3 "$RUN" --rdzv-id hello-$$ "$TMP/hello" 2>&1)
    check "MPICH program under idist-run --rdzv-id (PMI_FD left to it): exit 0, every rank sums 6" \
      eval '[ $? = 0 ] && [ "$(count "$out" "sum 6")" = 3 ]'
    "${HYDRA[@]}" -n 2 "$RUN" "$TMP/hello" >"$TMP/out" 2>&1
    rc=$?
    check "MPICH program under idist-run asking PMI_FD itself: fails (exit $rc), never exit 0" test $rc -ne 0
  else
    echo "skipped: MPICH program cases (mpicc.mpich failed: $(head -1 "$TMP/cc.err"))"
  fi
else
  echo "skipped: MPICH program cases (no mpicc.mpich; apt-get install libmpich-dev)"
fi

# Marks without a topology: one line naming the variables, exit 2.
out=$(env -i PATH="$PATH" PMI_ID=0 "$RUN" "$EX/all_reduce" 2>&1)
rc=$?
check "PMI_ID without PMI_PORT: exit 2, one line naming them ($out)" \
  eval '[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && contains "$out" "PMI_ID is set but PMI_PORT is not"'
out=$(env -i PATH="$PATH" PMIX_RANK=1 PMIX_NAMESPACE=ns "$RUN" "$EX/all_reduce" 2>&1)
rc=$?
check "PMIx rank without a size: exit 2, not a world of one ($out)" \
  eval '[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && contains "$out" "PMIX_SIZE"'
out=$(env -i PATH="$PATH" PMI_PORT=127.0.0.1:1 PMI_ID=0 "$RUN" "$EX/all_reduce" 2>&1)
rc=$?
check "an unreachable PMI server: exit 2, one line naming PMI_PORT ($out)" \
  eval '[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && contains "$out" "PMI_PORT=127.0.0.1:1"'

# The library alone, started by mpiexec without idist-run: an error, not three worlds of one.
out=$("${HYDRA[@]}" -n 2 "$EX/all_reduce" 2>&1)
rc=$?
# Hydra itself is sometimes killed by SIGPIPE (141) when both ranks end at once, before it has
# passed on their lines (seen once in a full parallel run): once more then.
if [ $rc = 141 ]; then
  out=$("${HYDRA[@]}" -n 2 "$EX/all_reduce" 2>&1)
  rc=$?
fi
check "mpiexec.hydra -n 2 all_reduce without idist-run: fails (exit $rc), naming idist-run" \
  eval '[ $rc -ne 0 ] && contains "$out" "without idist-run" && ! contains "$out" "After performing"'
out=$("${HYDRA[@]}" -n 1 "$EX/all_reduce" 2>&1)
check "mpiexec.hydra -n 1 all_reduce without idist-run: a world of one is right" \
  contains "$out" "Rank 0, After performing all_reduce: [1, 2]"
finish
