#!/bin/bash
# One SLURM task per rank: 2 nodes x 2 tasks = 4 ranks. srun starts each task through
# idist-run, which reads SLURM's variables, sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
# MASTER_PORT and friends, and execs the program in place (srun keeps its signals and exit codes).
#
#   sbatch scripts/examples/sbatch_task_per_rank.sh [ARGS...]      (PROGRAM=./train to change it)
#
#SBATCH --job-name=idist-task-per-rank
#SBATCH --nodes=2 --ntasks-per-node=2
#SBATCH --time=00:10:00
set -euo pipefail
PROGRAM=${PROGRAM:-./all_reduce}
# Optional: only this job's ranks may join its rendezvous store.
IDIST_JOB_TOKEN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export IDIST_JOB_TOKEN
srun idist-run "$PROGRAM" "$@"
