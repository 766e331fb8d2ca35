#!/bin/bash
# UCX between hosts against gloo and Open MPI: two fake hosts (network namespaces joined by a
# veth pair, each under a host name of its own, as tests/e2e/hierarchical_netns.sh makes them),
# all_reduce from 8 B to 64 MiB (x2 each step), three ways, alternating, the order reversed every other round:
#   ucx   IDIST_INTERHOST=ucx  UCX_TLS=tcp idist-run --nnodes 2 ... idist-bench
#   gloo  IDIST_INTERHOST=gloo             idist-run --nnodes 2 ... idist-bench
#   mpi   mpirun (inside host A; host B reached through an rsh agent that enters its namespace)
#         bench/raw_mpi, btl tcp between the hosts (vader within one); --bind-to none: each fake
#         host believes it owns every core, so Open MPI's own binding puts both hosts' first
#         ranks on core 0 (3-8 ms per 8 B all_reduce, measured), which two real hosts never do;
#         idist-run binds by default, but leaves out the cpus another idist-run here claimed,
#         so host B's ranks stay unbound (before claims: 1.6-1.9x Open MPI's time from 1 to
#         16 MiB with 2 ranks per host, both leaders on cpu 0)
# UCX_TLS=tcp: namespaces of one machine could share memory, which two hosts cannot.
# Writes DATA/WAY-PPN-ROUND.json (idist-bench's and raw_mpi's --json) and prints a table of the
# best median per size (bench/ucx_table.py).
# RATE=1gbit shapes the link (tc tbf on both ends of the veth, each direction at RATE) and
# adds each way's share of that line rate to the table; BEGIN=4M starts the sweep there (END=32K ends it there);
# WAYS="ucx mpi" runs only those (the table leaves the others' columns empty).
#   usage: [RATE=1gbit] [BEGIN=8] bench/ucx_two_hosts.sh BUILD_DIR DATA_DIR [ROUNDS] [PPN...]   (root, ip netns)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(realpath "$1")
DATA=$(mkdir -p "$2" && realpath "$2")
ROUNDS=${3:-3}
shift $(($# < 3 ? $# : 3))
PPNS=("$@")
[ ${#PPNS[@]} -gt 0 ] || PPNS=(1 2)
RUN=$BUILD/apps/idist-run/idist-run
BENCH=$BUILD/apps/idist-bench/idist-bench
RAW_MPI=$BUILD/bench/raw_mpi
SWEEP=(all_reduce -b "${BEGIN:-8}" -e "${END:-64M}" -f 2 -w 5 -t 0.1 --json)
source "$ROOT/tests/e2e/lib.sh"
tag=$$
AGENT=$(mktemp -d)
trap 'netns_cleanup || true; rm -rf "$AGENT"' EXIT
netns_pair $tag || { echo "ucx_two_hosts: cannot make two fake hosts here (root, ip netns)" >&2; exit 77; }
HOST_A=bench-a$tag HOST_B=bench-b$tag
if [ -n "${RATE:-}" ]; then
  # A token bucket on each end's egress: RATE each way, as a full-duplex link of that speed.
  for end in "$NS_A va$tag" "$NS_B vb$tag"; do
    set -- $end
    ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$RATE" burst 256kb latency 50ms
  done
  echo "ucx_two_hosts: the link shaped to $RATE each way (tc tbf)" >&2
fi
echo "$NS_A" >"$AGENT/ns.$HOST_A"
echo "$NS_B" >"$AGENT/ns.$HOST_B"
# Open MPI's rsh agent: "agent [options] HOST COMMAND..." runs COMMAND in HOST's namespace.
cat >"$AGENT/agent" <<AGENT
#!/bin/bash
while [[ "\$1" == -* ]]; do shift; done
host=\$1; shift
exec ip netns exec "\$(cat $AGENT/ns.\$host)" unshare --uts sh -c 'hostname "\$0"; eval "\$*"' "\$host" "\$@"
AGENT
chmod +x "$AGENT/agent"
on_host() {  # on_host A|B COMMAND...
  local ns=$NS_A name=$HOST_A
  [ "$1" = B ] && ns=$NS_B name=$HOST_B
  shift
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}
port=29800
export IDIST_JOB_TOKEN=bench$tag IDIST_TIMEOUT=120
idist_way() {  # idist_way INTERHOST PPN OUT
  port=$((port + 1))
  IDIST_INTERHOST=$1 UCX_TLS=tcp on_host B "$RUN" --nnodes 2 --node-rank 1 --master-addr "$ADDR_A" --master-port $port \
    -n "$2" "$BENCH" "${SWEEP[@]}" >/dev/null 2>"$3.err.b" &
  local b=$!
  IDIST_INTERHOST=$1 UCX_TLS=tcp on_host A "$RUN" --nnodes 2 --node-rank 0 --master-addr "$ADDR_A" --master-port $port \
    -n "$2" "$BENCH" "${SWEEP[@]}" >"$3" 2>"$3.err"
  wait $b
}
mpi_way() {  # mpi_way PPN OUT
  printf "%s slots=%s\n%s slots=%s\n" "$HOST_A" "$1" "$HOST_B" "$1" >"$AGENT/hosts"
  local net=${ADDR_A%.1}.0/24 yield=()
  # More ranks than cores in all (each fake host sees every core, so Open MPI would not know):
  # ask it to yield while waiting, as it does itself when it knows it is oversubscribed.
  [ $((2 * $1)) -gt "$(nproc)" ] && yield=(--mca mpi_yield_when_idle 1)
  on_host A mpirun --allow-run-as-root --hostfile "$AGENT/hosts" -np $((2 * $1)) --map-by ppr:"$1":node \
    --mca plm_rsh_agent "$AGENT/agent" --mca oob_tcp_if_include "$net" --mca btl_tcp_if_include "$net" \
    --mca btl tcp,self,vader --bind-to none "${yield[@]}" "$RAW_MPI" "${SWEEP[@]}" >"$2" 2>"$2.err"
}
for ppn in "${PPNS[@]}"; do
  for round in $(seq 1 "$ROUNDS"); do
    ways=(${WAYS:-ucx gloo mpi})
    [ $((round % 2)) = 0 ] && ways=($(printf '%s\n' "${ways[@]}" | tac))
    for way in "${ways[@]}"; do
      out=$DATA/$way-$ppn-$round.json
      echo "ucx_two_hosts: $way, $ppn rank(s) per host, round $round" >&2
      if [ "$way" = mpi ]; then mpi_way "$ppn" "$out"; else idist_way "$way" "$ppn" "$out"; fi
    done
  done
done
RATE=${RATE:-} python3 "$ROOT/bench/ucx_table.py" "$DATA"
trap - EXIT
netns_cleanup || true  # lib.sh is written for scripts without set -e
rm -rf "$AGENT"
