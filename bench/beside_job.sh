#!/bin/bash
# Issue 48: an 8-byte all_reduce on 2 ranks beside another idist job (a 2-rank train_cifar10,
# started first, so that it binds its ranks and the benchmark's idist-run finds the cpus
# claimed), alternating in one run: idist's default (since issue 48's fix it spins beside
# another job; it once yielded from the first turn), idist spinning (IDIST_CPUS_SHARED=0),
# mpirun (Open MPI's default: bound, spinning) and nothing, the order reversed every other
# round. Each window is one 2.5 s run of the benchmark (idist-bench -t: batches until the time
# is spent); per window, its mean call, and the
# neighbour's epochs finished per second with their median time (its own clock).
#   usage: bench/beside_job.sh BUILD_DIR [ROUNDS]      prints one line per way
set -euo pipefail
BUILD=$(realpath "$1")
ROUNDS=${2:-10}
RUN=$BUILD/apps/idist-run/idist-run
WORK=$(mktemp -d)
trap 'pkill -f "train_cifar10 --width 8 --samples 512 --batch-size 32 --epochs 100000" || true; rm -rf "$WORK"' EXIT
cd "$WORK"
export OMP_NUM_THREADS=1
"$RUN" -n 2 "$BUILD/apps/examples/train_cifar10" --width 8 --samples 512 --batch-size 32 --epochs 100000 \
  --log-every 100000 >neighbour.out 2>&1 &
sleep 8
epochs() { grep "^Train Epoch" neighbour.out | sed 's/.*(\([0-9.]*\) s)$/\1/' || true; }
measure() {
  local name=$1 n0 n1 t0 t1 us med rate
  shift
  n0=$(epochs | wc -l)
  t0=$(date +%s%N)
  if [ "$name" = none ]; then
    sleep 2.6
    us=-
  else
    us=$("$@" -b 8 -e 8 -t 2.5 all_reduce 2>/dev/null | awk '$2 == 8 {print $7}')
  fi
  n1=$(epochs | wc -l)
  t1=$(date +%s%N)
  med=$(epochs | sed -n "$((n0 + 1)),${n1}p" | sort -n | awk '{ v[NR] = $1 } END { print NR ? v[int((NR + 1) / 2)] : "-" }')
  rate=$(awk -v n=$((n1 - n0)) -v ns=$((t1 - t0)) 'BEGIN { printf "%.2f", n * 1e9 / ns }')
  echo "$name ${us:--} $rate $med"
}
for r in $(seq "$ROUNDS"); do
  order="default spin mpirun none"
  [ $((r % 2)) = 0 ] && order="none mpirun spin default"
  for way in $order; do
    case $way in
      default) measure default "$RUN" -n 2 "$BUILD/apps/idist-bench/idist-bench" ;;
      spin) measure spin env IDIST_CPUS_SHARED=0 "$RUN" -n 2 "$BUILD/apps/idist-bench/idist-bench" ;;
      mpirun) measure mpirun mpirun --allow-run-as-root -np 2 "$BUILD/bench/raw_mpi" ;;
      none) measure none ;;
    esac
  done
done >rows.txt
echo "# way: 8 B all_reduce mean (us) per round | the neighbour's epochs/s | its median epoch (s)"
for way in default spin mpirun none; do
  awk -v w=$way '$1 == w { us = us " " $2; ra = ra " " $3; ep = ep " " $4 } END { printf "%-8s us:%s\n         epochs/s:%s\n         epoch s:%s\n", w, us, ra, ep }' rows.txt
done
