#!/bin/bash
# The benchmark, end to end. Installs what is missing (apt-get), builds the programs it needs,
# and measures on this machine, in one run:
#   0. the memcpy bandwidth of 1 and 2 threads (bench/copy_bw): the ceiling shm's busbw is read against;
#   1. every collective on 2 and 4 ranks, 8 B to 256 MiB, five ways, one harness (apps/idist-bench,
#      bench/raw_gloo, bench/raw_mpi: the same sweep, timing and checks):
#        shm        IDIST_INTRANODE=shm idist-run -n N idist-bench      (what one host gets by default)
#        gloo-TCP   IDIST_INTRANODE=off idist-run -n N idist-bench      (gloo over loopback TCP)
#        raw Gloo   idist-run -n N bench/raw_gloo
#        raw MPI    mpirun -np N bench/raw_mpi
#        idist-mpi  mpirun -np N idist-bench --backend mpi
#      each next to its reference, back to back, the order reversed every other round (gloo-TCP
#      beside raw Gloo; shm, raw MPI, idist-mpi in a row, raw MPI in the middle, so that both
#      sit beside it); small sizes three times and large ones twice, as a 2-core machine is noisy;
#      and idist's own CPU time per call on gloo over TCP (perf), which noise does not blur;
#   1b. all_reduce, broadcast, reduce and barrier on 4 ranks over two fake hosts, 2 + 2 (network
#      namespaces joined by a veth pair, as tests/e2e/hierarchical_netns.sh makes them): the
#      hierarchical backend (shared memory within each host, gloo among the hosts' leaders)
#      against IDIST_INTRANODE=off (gloo over TCP among all 4), alternating as above; needs root
#      and `ip netns`, left out with a note where they cannot be had;
#   2. launch cost: init + one barrier + exit under `idist-run -n N`, `mpirun -np N` and, where
#      python3-torch is installed, torchrun, for N = 1 to 64; and `idist-run -n 1 /bin/true`
#      against `/bin/true`;
# then writes docs/BENCHMARKS.md (the machine, the targets met or missed, every figure; the
# hand-written "What we found" at its end is kept) and the plots docs/bench-*.png (gnuplot).
# mpirun runs with the settings Open MPI picks itself (its own binding), plus --oversubscribe
# only where N ranks do not fit the cores: a reference must not be slowed by our flags.
#
#   bash scripts/bench.sh               the full run: about 26 minutes on 2 cores (collectives 22,
#                                       two hosts 1, launch 3; a first build adds 5). Five measurements where
#                                       there were four still fit under 30 minutes with the
#                                       repeats as they were; should they not, cut the large
#                                       sizes (256 MiB is half of a large run), not the repeats
#   bash scripts/bench.sh --quick       a short sweep in about a minute and a half, to try the script
#   options: --build-dir DIR (default build-bench)   --out DIR (default docs)
#            --keep DIR: also keep every run's own --json document and the launch timings there
#
# Run it on a quiet machine: on 2 cores anything else running shows in every figure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

MODE=full
BUILD=build-bench
OUT=docs
KEEP=""
while [ $# -gt 0 ]; do
  case $1 in
    --quick) MODE=quick ;;
    --build-dir) BUILD=$2; shift ;;
    --out) OUT=$2; shift ;;
    --keep) KEEP=$2; shift ;;
    -h|--help) sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench.sh: error: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# --- what the build and the measurements need ---------------------------------------------------
PACKAGES=(
  g++ cmake make pkg-config
  libgloo-dev libcli11-dev libspdlog-dev nlohmann-json3-dev libboost1.81-dev libssl-dev
  openmpi-bin libopenmpi-dev      # mpirun, the mpi backend, raw_mpi
  doctest-dev                     # the configure step looks for it (the tests are not built here)
  python3                         # bench/report.py
  gnuplot-nox                     # the plots
  linux-perf                      # idist's own CPU time per call
  iproute2                        # ip netns: the two fake hosts
)
source scripts/install_missing.sh
install_missing bench "${PACKAGES[@]}"
# netns_pair and netns_cleanup: the two fake hosts made exactly as the end-to-end test of the
# hierarchical backend makes them, so that what is measured is what is tested.
source tests/e2e/lib.sh

BUILD_TYPE=RelWithDebInfo  # -O2 and NDEBUG, as users build; -g for perf and callgrind
echo "bench: building into $BUILD ($BUILD_TYPE)"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=$BUILD_TYPE -DIDIST_WITH_MPI=ON >/dev/null
# idist_backend_mpi: the mpi backend is a plugin, loaded at init; nothing links it, so nothing
# above would build it.
cmake --build "$BUILD" -j "$(nproc)" --target idist-run idist-bench raw_gloo raw_mpi idist_barrier mpi_barrier wall_time copy_bw \
  idist_backend_mpi >/dev/null

B=$ROOT/$BUILD
IDIST_RUN=$B/apps/idist-run/idist-run
IDIST_BENCH=$B/apps/idist-bench/idist-bench
RAW_GLOO=$B/bench/raw_gloo
RAW_MPI=$B/bench/raw_mpi
WALL_TIME=$B/bench/wall_time
COPY_BW=$B/bench/copy_bw
CORES=$(nproc)
# mpirun_for N: MPIRUN for N ranks, as Open MPI would be run by someone who knows it: its own
# binding (to core up to 2 ranks, none once oversubscribed) and --oversubscribe only where it
# refuses to start without, N beyond the cores. Forcing either on the reference where it is not
# needed (--bind-to none, say) would slow the reference and flatter idist.
mpirun_for() {
  MPIRUN=(mpirun --allow-run-as-root)
  if [ "$1" -gt "$CORES" ]; then MPIRUN+=(--oversubscribe); fi
}
# idist-run spawns here whatever environment the script runs in (an sbatch shell, say).
export IDIST_NO_DETECT=1
# Each measurement that needs one sets its own; everything else (launch, raw Gloo) runs with
# what a user gets by default, not with what the caller's shell happens to say.
unset IDIST_INTRANODE

# On a 2-core machine one run differs from the next by more than idist's overhead (the
# scheduler, a vCPU waking up, where memory lands): every size is measured several times, idist
# and its reference alternating, and the report keeps each one's best median call. Small sizes
# (latency, cheap) REPEAT times, large ones REPEAT_LARGE times.
if [ "$MODE" = quick ]; then
  BW_NS=(2)
  SMALL=(-b 8 -e 32K -f 16 -w 1 -t 0.05)
  SMALL_SPIN=("${SMALL[@]}")
  # Up to 64 MiB even here, so that every target of the report is judged (and its code run).
  LARGE=(-b 64K -e 64M -f 32 -w 1 -t 0.05)
  REPEAT=2
  REPEAT_LARGE=1
  # Two hosts: a check that it runs, not figures.
  HIER_SMALL=("${SMALL[@]}")
  HIER_LARGE=(-b 64K -e 2M -f 32 -w 1 -t 0.05)
  HIER_REPEAT=1
  HIER_REPEAT_LARGE=1
  CPU_CALLS=1000
  LAUNCH_NS=(1 2 4 8)
  LAUNCH_REPS=3
  TORCH_NS=(1 2)
  TORCH_REPS=1
  TRUE_REPS=10
  COPY_SECONDS=0.3
else
  BW_NS=(2 4)
  SMALL=(-b 8 -e 32K -f 2 -w 5 -t 0.1)
  # The spinning ones (shm, MPI) warm up for a thousand calls, not five: the loop's length is
  # sized from the warm-up, and five calls just after start-up (4 ranks on 2 cores still
  # settling) made it a few hundred calls long, whose median missed the steady state by 2-3x.
  # Gloo's calls cost 100-300 us: a thousand of them would add minutes for nothing.
  SMALL_SPIN=(-b 8 -e 32K -f 2 -w 1000 -t 0.1)
  LARGE=(-b 64K -e 256M -f 2 -w 1 -t 0.1)
  REPEAT=3
  REPEAT_LARGE=2
  # Two hosts: the same repeats, but the large sizes stop at 64 MiB, which keeps the section
  # near a minute: up to 256 MiB, 4 ranks on 2 cores would spend four times as long on them
  # (gloo over TCP takes about 0.14 s a call at 64 MiB) for points the curve already shows.
  HIER_SMALL=("${SMALL[@]}")
  HIER_LARGE=(-b 64K -e 64M -f 2 -w 1 -t 0.1)
  HIER_REPEAT=$REPEAT
  HIER_REPEAT_LARGE=$REPEAT_LARGE
  CPU_CALLS=5000
  LAUNCH_NS=(1 2 4 8 16 32 64)
  LAUNCH_REPS=7
  # torchrun takes 6 s and more per launch (its agent looks at the workers every 5 s), and
  # python3 imports torch in every worker: up to 8 ranks, 3 runs each, keeps it to 2 minutes.
  TORCH_NS=(1 2 4 8)
  TORCH_REPS=3
  TRUE_REPS=50
  COPY_SECONDS=1
fi
COLLECTIVES=(all_reduce all_gather broadcast reduce_scatter reduce send_recv barrier)
# The collectives the hierarchical backend splits into a host part and a leaders' part; the
# others it hands to gloo over every rank, the same as IDIST_INTRANODE=off.
HIER_COLLECTIVES=(all_reduce broadcast reduce barrier)

DATA=$(mktemp -d)
# The fake hosts outlive the script unless removed: the trap takes them down on every way out
# (bash runs no EXIT trap when a signal kills it, hence the traps that turn those into exits).
trap 'netns_cleanup || true; rm -rf "$DATA"' EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
NOTES=()
mkdir -p "$DATA/bw"
START=$(date +%s)
LOAD=$(cut -d' ' -f1-3 /proc/loadavg)

# --- 0. the memory-bandwidth ceiling ------------------------------------------------------------
echo "bench: memcpy bandwidth, 1 and 2 threads"
"$COPY_BW" -s 64M -t "$COPY_SECONDS" -j 2 >"$DATA/copy_bw.json" 2>"$DATA/copy_bw.err" ||
  { echo "bench: copy_bw failed: $(tail -1 "$DATA/copy_bw.err")" >&2; rm -f "$DATA/copy_bw.json"; }

# What binding Open MPI chose for each N of the collectives: the report says it, as it is
# part of what raw MPI and idist-mpi were measured under.
for n in "${BW_NS[@]}"; do
  mpirun_for "$n"
  { "${MPIRUN[@]}" --report-bindings -np "$n" /bin/true 2>&1 || true; } >"$DATA/bindings-n$n.txt"
done

# --- 1. collectives -------------------------------------------------------------------------------
# Each program writes its --json document to bw/IMPL/; a failed run is reported and left out of
# the tables. The directory, not the document, says which of the five it was: idist-bench's
# document says "gloo" whether shared memory or TCP carried it.
measure() {
  local name=$1
  shift
  mkdir -p "$DATA/bw/$(dirname "$name")"
  if ! "$@" --json >"$DATA/bw/$name.json" 2>"$DATA/bw/$name.err"; then
    echo "bench: $name failed:" >&2
    tail -3 "$DATA/bw/$name.err" >&2
    rm -f "$DATA/bw/$name.json"
  fi
}
# one IMPL N NAME ARGS...: one run of IMPL (shm, gloo-tcp, raw-gloo, raw-mpi, idist-mpi; hier,
# hier-tcp: two_hosts below, always 4 ranks).
one() {
  local impl=$1 n=$2 name=$3
  shift 3
  mpirun_for "$n"
  case $impl in
    shm) measure "$impl/n$n-$name" env IDIST_INTRANODE=shm "$IDIST_RUN" -n "$n" "$IDIST_BENCH" "$@" ;;
    gloo-tcp) measure "$impl/n$n-$name" env IDIST_INTRANODE=off "$IDIST_RUN" -n "$n" "$IDIST_BENCH" "$@" ;;
    raw-gloo) measure "$impl/n$n-$name" "$IDIST_RUN" -n "$n" "$RAW_GLOO" "$@" ;;
    raw-mpi) measure "$impl/n$n-$name" "${MPIRUN[@]}" -np "$n" "$RAW_MPI" "$@" ;;
    idist-mpi) measure "$impl/n$n-$name" "${MPIRUN[@]}" -np "$n" "$IDIST_BENCH" --backend mpi "$@" ;;
    hier) measure "$impl/n4-$name" two_hosts auto "$@" ;;
    hier-tcp) measure "$impl/n4-$name" two_hosts off "$@" ;;
    *) echo "bench: unknown implementation $impl" >&2; exit 2 ;;
  esac
}
# row ROUND N NAME "IMPL..." ARGS...: the IMPLs back to back, in the order given in odd rounds
# and reversed in even ones: whichever runs later inherits what the one before left the
# machine doing (freeing gigabytes, for one), and that should not always be the same one. A
# reference in the middle of three sits next to both the others in every round.
row() {
  local round=$1 n=$2 name=$3 impls=($4) i
  shift 4
  if [ $((round % 2)) = 0 ]; then
    for ((i = ${#impls[@]} - 1; i >= 0; i--)); do one "${impls[i]}" "$n" "$name" "$@"; done
  else
    for i in "${impls[@]}"; do one "$i" "$n" "$name" "$@"; done
  fi
}
for n in "${BW_NS[@]}"; do
  for c in "${COLLECTIVES[@]}"; do
    echo "bench: $c on $n ranks: shm, gloo-TCP, raw Gloo, raw MPI, idist-mpi"
    for r in $(seq "$REPEAT"); do
      row "$r" "$n" "$c-small$r" "gloo-tcp raw-gloo" "${SMALL[@]}" "$c"
      row "$r" "$n" "$c-small$r" "shm raw-mpi idist-mpi" "${SMALL_SPIN[@]}" "$c"
    done
    [ "$c" = barrier ] && continue
    for r in $(seq "$REPEAT_LARGE"); do
      row "$r" "$n" "$c-large$r" "gloo-tcp raw-gloo" "${LARGE[@]}" "$c"
      row "$r" "$n" "$c-large$r" "shm raw-mpi idist-mpi" "${LARGE[@]}" "$c"
    done
  done
done

# --- 1b. two hosts, 2 + 2 ranks -------------------------------------------------------------------
# on_host A|B COMMAND...: COMMAND in that host's network namespace, under its host name (the
# ranks tell hosts apart by name), as in tests/e2e/hierarchical_netns.sh.
on_host() {
  local ns=$NS_A name=host-a$HIER_TAG
  [ "$1" = B ] && ns=$NS_B name=host-b$HIER_TAG
  shift
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}
# two_hosts auto|off ARGS...: idist-bench ARGS on 4 ranks, idist-run once on each host (node 1
# in the background), IDIST_INTRANODE left at its default (auto: the hierarchical backend) or
# off. Only rank 0, on host A, prints the document; host B's output goes with the errors. Each
# run on a port of its own, so that none waits for the last one's to be free. The timeouts
# keep one run that hangs, or one node left alone, from holding up the rest of the benchmark.
HIER_PORT=29700
two_hosts() {
  local vars=(IDIST_JOB_TOKEN=bench$HIER_TAG IDIST_TIMEOUT=60) b rc=0
  [ "$1" = off ] && vars+=(IDIST_INTRANODE=off)
  shift
  HIER_PORT=$((HIER_PORT + 1))
  local run=(timeout 600 "$IDIST_RUN" --nnodes 2 --master-addr "$ADDR_A" --master-port "$HIER_PORT" -n 2)
  on_host B env "${vars[@]}" "${run[@]}" --node-rank 1 "$IDIST_BENCH" "$@" >&2 &
  b=$!
  on_host A env "${vars[@]}" "${run[@]}" --node-rank 0 "$IDIST_BENCH" "$@" || rc=$?
  wait "$b" || rc=$((rc ? rc : $?))
  return "$rc"
}
HIER_TAG=$$
HIER=0
if ! command -v unshare >/dev/null || ! netns_pair "$HIER_TAG" || ! on_host A true 2>/dev/null ||
  ! on_host B true 2>/dev/null; then
  NOTES+=("The two-host measurement (hierarchical against gloo over TCP) was left out: no network namespaces, veth pair or UTS namespace could be made here (needs root, iproute2, util-linux and CAP_NET_ADMIN, CAP_SYS_ADMIN).")
  echo "bench: NOTE: cannot make two fake hosts here (ip netns, needs root); the two-host measurement is left out"
# One barrier first: where the hosts cannot reach each other, every run would fail, each only
# after the timeout.
elif ! two_hosts auto -b 8 -e 8 -w 0 -n 1 barrier >"$DATA/hier-probe.out" 2>&1; then
  NOTES+=("The two-host measurement (hierarchical against gloo over TCP) was left out: a first barrier on two fake hosts failed ($(tail -1 "$DATA/hier-probe.out")).")
  echo "bench: NOTE: a barrier on two fake hosts failed; the two-host measurement is left out:" >&2
  tail -3 "$DATA/hier-probe.out" >&2
else
  HIER=1
fi
if [ $HIER = 1 ]; then
  for c in "${HIER_COLLECTIVES[@]}"; do
    echo "bench: $c on two hosts, 2 + 2 ranks: hierarchical, gloo-TCP"
    for r in $(seq "$HIER_REPEAT"); do
      row "$r" 4 "$c-small$r" "hier hier-tcp" "${HIER_SMALL[@]}" "$c"
    done
    [ "$c" = barrier ] && continue
    for r in $(seq "$HIER_REPEAT_LARGE"); do
      row "$r" 4 "$c-large$r" "hier hier-tcp" "${HIER_LARGE[@]}" "$c"
    done
  done
fi
netns_cleanup || true

# What idist's own code costs per call, which the wall clock of small calls (tens of
# microseconds of scheduler noise) cannot show: perf samples the ranks at 10 kHz, and the
# samples that fall in libidist, over the calls made, are its CPU time per call (gloo over TCP,
# 2 ranks, 8 B; one send_recv "call" is a round trip). Over TCP because there Gloo (its own
# library) does the work and libidist's samples are idist's overhead alone; the shm backend is
# part of libidist, so its samples would be the whole collective. Needs perf (linux-perf) and
# the right to use it; skipped with a note otherwise.
PERF_HZ=10000
if command -v perf >/dev/null && perf record -q -o "$DATA/probe.data" -- true >/dev/null 2>&1; then
  echo "bench: idist's own CPU time per call (perf), gloo over TCP, 2 ranks, 8 B"
  for c in "${COLLECTIVES[@]}"; do
    IDIST_INTRANODE=off perf record -q -F $PERF_HZ -o "$DATA/perf.data" -- "$IDIST_RUN" -n 2 "$IDIST_BENCH" -b 8 -e 8 -w 0 -c 0 \
      -n "$CPU_CALLS" "$c" >/dev/null 2>&1 || continue
    # Samples of the ranks (kernel included), and of those the ones in libidist.
    all=$(perf report -i "$DATA/perf.data" --sort comm -F sample,comm --stdio -g none 2>/dev/null |
      awk '$2 == "idist-bench" {print $1}')
    mine=$(perf report -i "$DATA/perf.data" --comm idist-bench --sort dso -F sample,dso --stdio -g none 2>/dev/null |
      awk '$2 ~ /^libidist\.so/ {s += $1} END {print s + 0}')
    awk -v c="$c" -v hz=$PERF_HZ -v calls="$((CPU_CALLS * 2))" -v all="${all:-0}" -v mine="$mine" \
      'BEGIN {printf "{\"collective\": \"%s\", \"idist_us\": %.3f, \"all_us\": %.3f}\n", c,
              mine / hz / calls * 1e6, all / hz / calls * 1e6}' >>"$DATA/cpu.jsonl"
  done
else
  NOTES+=("idist's own CPU time per call was not measured: perf is missing or not allowed here (apt-get install linux-perf; kernel.perf_event_paranoid).")
  echo "bench: NOTE: no perf; idist's own CPU time per call is left out"
fi

# --- 2. launch cost -------------------------------------------------------------------------------
# launch KIND N REPS WARMUP COMMAND...: one line of launch.jsonl.
launch() {
  local kind=$1 n=$2 reps=$3 warmup=$4 result
  shift 4
  if result=$("$WALL_TIME" -r "$reps" -w "$warmup" -- "$@" 2>"$DATA/launch.err"); then
    echo "{\"kind\": \"$kind\", \"n\": $n, \"result\": $result}" >>"$DATA/launch.jsonl"
  else
    echo "bench: $kind with $n ranks failed: $(tail -1 "$DATA/launch.err")" >&2
  fi
}
TORCH=0
if /usr/bin/python3 -c "import torch.distributed.run" 2>/dev/null; then
  TORCH=1
  NOTES+=("torchrun (Debian's python3-torch, default monitor interval) was measured up to ${TORCH_NS[-1]} ranks, ${TORCH_REPS} runs each without an untimed one: it takes seconds per launch.")
else
  NOTES+=("torchrun was not measured: python3-torch is not installed here (apt-get install python3-torch to include it).")
  echo "bench: NOTE: python3-torch is not installed; torchrun is left out of the launch comparison"
fi
for n in "${LAUNCH_NS[@]}"; do
  echo "bench: launching $n ranks: idist-run, mpirun"
  launch idist-run "$n" "$LAUNCH_REPS" 1 "$IDIST_RUN" -n "$n" "$B/bench/idist_barrier"
  mpirun_for "$n"
  launch mpirun "$n" "$LAUNCH_REPS" 1 "${MPIRUN[@]}" -np "$n" "$B/bench/mpi_barrier"
done
if [ $TORCH = 1 ]; then
  for n in "${TORCH_NS[@]}"; do
    echo "bench: launching $n ranks: torchrun"
    # Debian's torch 1.13 under Python 3.11 cannot read its own default --redirects/--tee (0):
    # Python 3.11 changed IntFlag. 1 (stdout only) it can.
    launch torchrun "$n" "$TORCH_REPS" 0 /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node "$n" \
      --redirects 1 --tee 1 --log_dir "$DATA/torch" "$ROOT/bench/launch/torch_barrier.py"
  done
fi
echo "bench: /bin/true, alone and under idist-run -n 1"
launch true 1 "$TRUE_REPS" 1 /bin/true
launch idist-run-true 1 "$TRUE_REPS" 1 "$IDIST_RUN" -n 1 /bin/true

# --- 3. the report --------------------------------------------------------------------------------
ELAPSED=$(($(date +%s) - START))
python3 - "$DATA/meta.json" <<EOF
import json, sys
json.dump({
    "mode": "$MODE", "date": "$(date -u +%Y-%m-%dT%H:%MZ)", "elapsed_s": $ELAPSED, "load": "$LOAD",
    "build_type": "$BUILD_TYPE", "small_options": "$(echo "${SMALL[@]}")", "small_spin_options": "$(echo "${SMALL_SPIN[@]}")", "large_options": "$(echo "${LARGE[@]}")",
    "repeat": $REPEAT, "repeat_large": $REPEAT_LARGE, "cpu_calls": $CPU_CALLS,
    "hier_small_options": "$(echo "${HIER_SMALL[@]}")", "hier_large_options": "$(echo "${HIER_LARGE[@]}")",
    "hier_repeat": $HIER_REPEAT, "hier_repeat_large": $HIER_REPEAT_LARGE,
    "launch_ns": [$(IFS=,; echo "${LAUNCH_NS[*]}")], "launch_reps": $LAUNCH_REPS, "true_reps": $TRUE_REPS,
    "cores": $CORES, "mpirun": "mpirun --allow-run-as-root",
    "notes": $(python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "${NOTES[@]}"),
}, open(sys.argv[1], "w"))
EOF
python3 bench/report.py --data "$DATA" --out "$OUT"
if [ -n "$KEEP" ]; then
  mkdir -p "$KEEP"
  cp -r "$DATA"/. "$KEEP"/
  rm -rf "$KEEP/torch" "$KEEP"/*.data
  echo "bench: the raw results are in $KEEP (python3 bench/report.py --data $KEEP --out DIR redoes the report)"
fi
echo "bench: done in $((ELAPSED / 60)) min $((ELAPSED % 60)) s; see $OUT/BENCHMARKS.md"
