#!/bin/bash
# The training examples on small data, as users start them:
#   train_cifar10 (synthetic CIFAR-shaped set, a narrow ResNet-18) unchanged with no launcher,
#     --nproc-per-node 2 (idist::Parallel starts the ranks), idist-run -n 2, mpirun -np 2
#     --backend mpi, two idist-run nodes meeting at --rdzv-endpoint, and srun -n 2 on a real local
#     SLURM: each learns (validation accuracy above chance), rank 0 alone writes the checkpoints,
#     and a run given the same --checkpoint-dir resumes at the last save;
#   dist_mnist on MNIST idx files this test writes (a learnable synthetic set), one epoch.
# usage: examples.sh IDIST_RUN EXAMPLES_DIR
source "$(dirname "$0")/../e2e/lib.sh"
RUN=$(realpath "$1")
EX=$(realpath "$2")
CLUSTER=$(cd "$(dirname "$0")/../.." && pwd)/scripts/slurm-local.sh
TMP=$(mktemp -d /tmp/idist-torch-examples.XXXXXX)
cleanup() {
  bash "$CLUSTER" stop "$TMP/cluster" >/dev/null 2>&1
  rm -rf "$TMP"
}
trap cleanup EXIT
cd "$TMP"
export IDIST_TIMEOUT=60
small=(--epochs 3 --width 8 --samples 512 --batch-size 32 --log-every 100 --learning-rate 0.01)

# learns LABEL OUTPUT DIR: a validation accuracy above chance (0.1), and the checkpoints in DIR.
learns() {
  local label=$1 out=$2 dir=$3 accuracy
  accuracy=$(grep -o "Final validation accuracy: [0-9.]*" <<<"$out" | tail -1 | awk '{print $4}')
  check "$label: learns (final validation accuracy ${accuracy:-none} > 0.2)" \
    eval '[ -n "$accuracy" ] && awk "BEGIN {exit !($accuracy > 0.2)}"' || tail -5 <<<"$out" | sed 's/^/  | /'
  check "$label: rank 0 alone saved 3 times (16 steps an epoch), the newest 2 kept" \
    eval '[ "$(count "$out" "Checkpoint: ")" = 3 ] && [ "$(ls "$dir" | tr "\n" " ")" = "checkpoint_32.pt checkpoint_48.pt " ]'
}

out=$("$EX/train_cifar10" "${small[@]}" --output-path one 2>&1)
learns "train_cifar10, no launcher" "$out" one
check "... a world of one" contains "$out" "1 rank(s), backend gloo"

out=$("$EX/train_cifar10" "${small[@]}" --nproc-per-node 2 --output-path spawned 2>&1)
learns "train_cifar10 --nproc-per-node 2 (idist::Parallel)" "$out" spawned
check "... 2 ranks" contains "$out" "2 rank(s), backend gloo"

out=$("$RUN" -n 2 "$EX/train_cifar10" "${small[@]}" --output-path run 2>&1)
learns "idist-run -n 2 train_cifar10" "$out" run
four=(--epochs 4 "${small[@]:2}")
out=$("$RUN" -n 2 "$EX/train_cifar10" "${four[@]}" --checkpoint-dir run 2>&1)
check "train_cifar10 again with the same --checkpoint-dir and a 4th epoch: resumes at step 48" \
  contains "$out" "train_cifar10: done steps=64 redone=0 resumed_from=48 seen=512 " || tail -3 <<<"$out"
fresh=$("$RUN" -n 2 "$EX/train_cifar10" "${four[@]}" --checkpoint-dir fresh 2>&1)
params=$(grep -o 'params=.*' <<<"$out")
check "... to the parameters of 4 epochs in one go" eval '[ -n "$params" ] && [ "$params" = "$(grep -o "params=.*" <<<"$fresh")" ]'

if command -v mpirun >/dev/null; then
  out=$(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$EX/train_cifar10" "${small[@]}" \
    --backend mpi --output-path mpi 2>&1)
  learns "mpirun -np 2 train_cifar10 --backend mpi" "$out" mpi
  check "... on the mpi backend" contains "$out" "2 rank(s), backend mpi"
fi

port=$(random_port)
"$RUN" --nnodes 2 --rdzv-endpoint 127.0.0.1:$port --rdzv-id torch-ex-$$ -n 1 "$EX/train_cifar10" "${small[@]}" \
  --output-path nodes >"$TMP/node1" 2>&1 &
node1=$!
out=$("$RUN" --nnodes 2 --rdzv-endpoint 127.0.0.1:$port --rdzv-id torch-ex-$$ -n 1 "$EX/train_cifar10" "${small[@]}" \
  --output-path nodes 2>&1)
wait $node1
out="$out
$(cat "$TMP/node1")"
learns "two idist-run nodes at --rdzv-endpoint" "$out" nodes

if [ "$(id -u)" = 0 ] && command -v slurmctld >/dev/null && line=$(bash "$CLUSTER" start "$TMP/cluster" --nodes 1 2>/dev/null); then
  eval "$line"
  out=$(timeout 120 srun --immediate=10 -n 2 "$EX/train_cifar10" "${small[@]}" --output-path srun 2>&1)
  learns "srun -n 2 train_cifar10 (a real local SLURM)" "$out" srun
  check "... 2 ranks from SLURM's variables" contains "$out" "2 rank(s), backend gloo"
else
  echo "SKIPPED: srun (needs root and slurmctld; scripts/setup.sh installs them)"
fi

# MNIST's idx format (big-endian magic and sizes, then bytes), at MNIST's sizes, which
# libtorch's reader insists on. A learnable set: each digit a fixed random 28 x 28 pattern
# under noise. numpy comes with python3-torch.
/usr/bin/python3 - <<'EOF'
import numpy as np
rng = np.random.default_rng(3)
patterns = rng.random((10, 784))
def write(prefix, n):
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = (255 * (0.6 * patterns[labels] + 0.4 * rng.random((n, 784)))).astype(np.uint8)
    with open(f"{prefix}-images-idx3-ubyte", "wb") as f:
        f.write(np.array([2051, n, 28, 28], ">u4").tobytes() + images.tobytes())
    with open(f"{prefix}-labels-idx1-ubyte", "wb") as f:
        f.write(np.array([2049, n], ">u4").tobytes() + labels.tobytes())
write("train", 60000)
write("t10k", 10000)
EOF
out=$("$RUN" -n 2 "$EX/dist_mnist" "$TMP" 1 2>&1)
check "dist_mnist under idist-run -n 2: exit 0" equals $? 0 || tail -5 <<<"$out" | sed 's/^/  | /'
accuracy=$(grep -o "Test Accuracy - [0-9.]*" <<<"$out" | awk '{print $4}')
check "dist_mnist: test accuracy ${accuracy:-none}% > 50%" eval '[ -n "$accuracy" ] && awk "BEGIN {exit !($accuracy > 50)}"'
check "dist_mnist: one accuracy line per epoch, from rank 0" equals "$(count "$out" "Accuracy in epoch")" 1
finish
