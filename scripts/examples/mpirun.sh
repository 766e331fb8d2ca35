#!/bin/bash
# mpirun starts the ranks and idist-run translates Open MPI's variables into the env contract;
# the program's collectives go over gloo (the default) or, with BACKEND=mpi, over MPI itself.
#
#   scripts/examples/mpirun.sh [ARGS...]     (NP=4, PROGRAM=./all_reduce, BACKEND=gloo|mpi)
#
# As root, Open MPI wants OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1.
set -euo pipefail
PROGRAM=${PROGRAM:-./all_reduce}
exec mpirun --oversubscribe -np "${NP:-4}" idist-run --backend "${BACKEND:-gloo}" "$PROGRAM" "$@"
