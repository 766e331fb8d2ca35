#!/bin/bash
# Two machines, no scheduler (torchrun's static rendezvous): run this on each, node 0 first or
# not; the ranks wait for each other up to IDIST_TIMEOUT. 2 nodes x 2 ranks = 4 ranks.
#
#   RDZV_ID=SECRET scripts/examples/two_nodes_static.sh NODE_RANK MASTER_ADDR [ARGS...]
#   e.g. on 10.0.0.1: two_nodes_static.sh 0 10.0.0.1     on the other: two_nodes_static.sh 1 10.0.0.1
#
# RDZV_ID names the job and is the store's password: the same on both nodes, and unguessable
# (e.g. `openssl rand -hex 8`, made once and handed to both). An exported IDIST_JOB_TOKEN does
# the same job without showing in `ps`.
set -euo pipefail
NODE_RANK=${1:?usage: two_nodes_static.sh NODE_RANK MASTER_ADDR [ARGS...]}
MASTER_ADDR=${2:?usage: two_nodes_static.sh NODE_RANK MASTER_ADDR [ARGS...]}
shift 2
PROGRAM=${PROGRAM:-./all_reduce}
exec idist-run --nnodes 2 --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" ${RDZV_ID:+--rdzv-id "$RDZV_ID"} \
  --master-port "${MASTER_PORT:-29500}" -n "${RANKS_PER_NODE:-2}" "$PROGRAM" "$@"
