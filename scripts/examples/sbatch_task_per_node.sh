#!/bin/bash
# One SLURM task per node, and idist-run spawns and supervises the node's ranks: 2 nodes x
# -n 2 = 4 ranks, node-major (node 0 holds ranks 0 and 1). This is torchrun's shape under
# SLURM; idist-run stops the node's ranks when one fails and names it.
#
#   sbatch scripts/examples/sbatch_task_per_node.sh [ARGS...]      (PROGRAM=./train to change it)
#
#SBATCH --job-name=idist-task-per-node
#SBATCH --nodes=2 --ntasks-per-node=1
#SBATCH --time=00:10:00
set -euo pipefail
PROGRAM=${PROGRAM:-./all_reduce}
IDIST_JOB_TOKEN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export IDIST_JOB_TOKEN
srun idist-run -n "${RANKS_PER_NODE:-2}" --tag-output "$PROGRAM" "$@"
