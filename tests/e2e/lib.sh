# Helpers for the end-to-end tests: TAP-like "ok"/"not ok" lines and a closing
# "N passed, N failed" line that ctest's output shows.
set -u
PASSED=0
FAILED=0
# Marks the sleeping ranks of this run so leftovers can be found with pgrep.
export MARKER="$$$RANDOM"

check() {
  local what=$1
  shift
  if "$@"; then
    PASSED=$((PASSED + 1))
    echo "ok - $what"
  else
    FAILED=$((FAILED + 1))
    echo "not ok - $what"
    return 1  # so that `check ... || show_details` shows them on failure only
  fi
}

contains() { grep -qF -- "$2" <<<"$1"; }
count() { grep -cF -- "$2" <<<"$1" || true; }
equals() { [ "$1" = "$2" ]; }

no_leftovers() {
  local i
  for i in $(seq 20); do
    pgrep -f "sleep 1000$MARKER" >/dev/null || return 0
    sleep 0.1
  done
  echo "  leftover processes: $(pgrep -af "sleep 1000$MARKER" | tr '\n' ' ')"
  pkill -KILL -f "sleep 1000$MARKER"
  return 1
}

# no_env_leftovers NAME=VALUE: no process (rank, or anything a rank started) still carries
# NAME=VALUE in its environment, 2 s at most after the run. Kills what it finds.
env_processes() {
  local f
  for f in /proc/[0-9]*/environ; do
    grep -qszx -- "$1" "$f" && echo "${f//[^0-9]/}"
  done
}
no_env_leftovers() {
  local i left
  for i in $(seq 20); do
    left=$(env_processes "$1")
    [ -z "$left" ] && return 0
    sleep 0.1
  done
  echo "  leftover processes with $1:" $(for p in $left; do echo "$p($(cat /proc/$p/comm 2>/dev/null))"; done)
  kill -KILL $left 2>/dev/null
  return 1
}

# no_run_leftovers RUN_ID: the same for a run's IDIST_RUN_ID.
no_run_leftovers() {
  [ -n "$1" ] || { echo "  no run id to look for"; return 1; }
  no_env_leftovers "IDIST_RUN_ID=$1"
}

# run_id_in FILE: the run id that `idist-run -v` announced in FILE.
run_id_in() { grep -o 'run id [^ ]*' "$1" | head -1 | cut -d' ' -f3; }

ranks_running() { pgrep -f "sleep 1000$MARKER" >/dev/null; }

now_ms() { date +%s%3N; }

# wait_for_line FILE PATTERN [SECONDS]: until a line of FILE matches PATTERN (grep's), 60 s at most.
# A deadline, not a count of tries: on a loaded CI machine both the steps and each try's grep are
# several times slower than on a quiet one, and a wait that gave up early let the next phase
# start at the wrong moment (a node meant to join a running job joined its first round).
wait_for_line() {
  local end=$((SECONDS + ${3:-60}))
  until grep -q -- "$2" "$1" 2>/dev/null; do
    [ "$SECONDS" -ge "$end" ] && { echo "# no line matching '$2' in $1 after ${3:-60} s"; return 1; }
    sleep 0.01
  done
}

# wait_for_lines FILE TEXT N: until FILE has N lines containing TEXT (10 s at most).
wait_for_lines() {
  local i
  for i in $(seq 100); do
    [ "$(grep -cF -- "$2" "$1" 2>/dev/null || true)" -ge "$3" ] && return 0
    sleep 0.1
  done
  return 1
}

# two_jobs NAME CMD...: starts `CMD... 1000` and `CMD... 7` at once, each a job of 3 ranks
# running job_sum or python/torch_job_sum.py (the value is their last argument), and checks
# that each job got its own sums, on its own port. Two jobs that met would mix their values
# (or fail): the sums, not the exit codes alone, are what shows it.
two_jobs() {
  local name=$1 dir start rca rcb pa pb
  shift
  dir=$(mktemp -d)
  start=$(now_ms)
  "$@" 1000 >"$dir/a" 2>&1 &
  local a=$!
  "$@" 7 >"$dir/b" 2>&1 &
  wait $!; rcb=$?
  wait $a; rca=$?
  pa=$(grep -o 'port [0-9]*' "$dir/a" | sort -u | tr '\n' ' ')
  pb=$(grep -o 'port [0-9]*' "$dir/b" | sort -u | tr '\n' ' ')
  echo "  $name: job 1000 on ${pa}, job 7 on ${pb}, both done in $(($(now_ms) - start)) ms"
  check "$name: both jobs exit 0" equals "$rca $rcb" "0 0"
  # Hydra forwards output in pieces, not lines ("...righttorch job..."): count matches, not lines.
  check "$name: job 1000's 3 ranks each sum 6000" \
    equals "$(grep -oE "job 1000 rank [0-2]/3 port [0-9]+ (attempt [-0-9]+ )?sum 6000 right" "$dir/a" | sort -u | wc -l)" 3
  check "$name: job 7's 3 ranks each sum 42" \
    equals "$(grep -oE "job 7 rank [0-2]/3 port [0-9]+ (attempt [-0-9]+ )?sum 42 right" "$dir/b" | sort -u | wc -l)" 3
  check "$name: the two jobs' stores are on different ports" test "$pa" != "$pb"
  [ "$(cat "$dir/a" "$dir/b" | grep -o " sum [0-9]* right" | wc -l)" = 6 ] || sed 's/^/  | /' "$dir/a" "$dir/b" | head -40
  rm -rf "$dir"
}

# wait_codes PID...: waits for each in turn; sets `codes` to their exit statuses, in order.
wait_codes() {
  codes=()
  local p
  for p in "$@"; do
    wait "$p"
    codes+=($?)
  done
}

# netns_pair TAG: two network namespaces joined by a veth pair, as two "hosts" that really
# talk over separate addresses. Sets NS_A, NS_B, ADDR_A, ADDR_B; netns_cleanup removes them.
# Fails (non-zero) where namespaces cannot be made (needs root, iproute2, CAP_NET_ADMIN).
netns_pair() {
  local tag=$1
  NS_A=idist-a$tag NS_B=idist-b$tag NETNS_TAG=$tag
  ADDR_A=10.77.$((tag % 250)).1 ADDR_B=10.77.$((tag % 250)).2
  [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null || return 1
  {
    ip netns add "$NS_A" && ip netns add "$NS_B" &&
      ip link add "va$tag" type veth peer name "vb$tag" &&
      ip link set "va$tag" netns "$NS_A" && ip link set "vb$tag" netns "$NS_B" &&
      ip -n "$NS_A" addr add "$ADDR_A/24" dev "va$tag" && ip -n "$NS_B" addr add "$ADDR_B/24" dev "vb$tag" &&
      ip -n "$NS_A" link set "va$tag" up && ip -n "$NS_B" link set "vb$tag" up &&
      ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up
  } 2>/dev/null
}
netns_cleanup() {
  [ -n "${NETNS_TAG:-}" ] || return 0
  ip netns del "$NS_A" 2>/dev/null
  ip netns del "$NS_B" 2>/dev/null
  ip link del "va$NETNS_TAG" 2>/dev/null  # left in the root namespace if the set-up failed half way
  return 0
}

# netns_hosts TAG N: N namespaces ("hosts") on one bridge, as machines on one switch:
# NS_HOST[i] with address ADDR_HOST[i] (10.78.T.i+1), i = 0..N-1; the bridge lives in a
# namespace of its own, so `netns_cut i` (its end of host i's cable down) drops host i's packets
# without a reset, as a pulled cable does. Returns non-zero where namespaces cannot be made.
netns_hosts() {
  local tag=$1 n=$2 i
  HOSTS_TAG=$tag HOSTS_N=$n NS_BRIDGE=idist-br$tag
  NS_HOST=() ADDR_HOST=()
  [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null || return 1
  {
    ip netns add "$NS_BRIDGE" && ip -n "$NS_BRIDGE" link add br0 type bridge && ip -n "$NS_BRIDGE" link set br0 up || return 1
    for i in $(seq 0 $((n - 1))); do
      NS_HOST[i]=idist-h$i-$tag ADDR_HOST[i]=10.78.$((tag % 250)).$((i + 1))
      ip netns add "${NS_HOST[i]}" &&
        ip link add "h$i-$tag" type veth peer name "b$i-$tag" &&
        ip link set "h$i-$tag" netns "${NS_HOST[i]}" && ip link set "b$i-$tag" netns "$NS_BRIDGE" &&
        ip -n "$NS_BRIDGE" link set "b$i-$tag" master br0 && ip -n "$NS_BRIDGE" link set "b$i-$tag" up &&
        ip -n "${NS_HOST[i]}" addr add "${ADDR_HOST[i]}/24" dev "h$i-$tag" &&
        ip -n "${NS_HOST[i]}" link set "h$i-$tag" up && ip -n "${NS_HOST[i]}" link set lo up || return 1
    done
  } 2>/dev/null
}
netns_cut() { ip -n "$NS_BRIDGE" link set "b$1-$HOSTS_TAG" down; }
netns_hosts_cleanup() {
  [ -n "${HOSTS_TAG:-}" ] || return 0
  local i
  for i in $(seq 0 $((HOSTS_N - 1))); do
    ip netns del "idist-h$i-$HOSTS_TAG" 2>/dev/null
    ip link del "h$i-$HOSTS_TAG" 2>/dev/null
  done
  ip netns del "$NS_BRIDGE" 2>/dev/null
  return 0
}
# skip_without_etcd: exits 77 (skipped), saying so, where etcd is not installed.
skip_without_etcd() {
  command -v etcd >/dev/null && return 0
  echo "SKIP: etcd not installed (Debian: etcd-server; scripts/setup.sh)"
  exit 77
}
# netns_etcd I: a one-member etcd on host I, its client endpoint in ETCD_EP and its pid in
# ETCD_PID (its data in $DIR), up once it answers (10 s at most; non-zero if it does not).
netns_etcd() {
  ETCD_EP=${ADDR_HOST[$1]}:2379
  ip netns exec "${NS_HOST[$1]}" "$(command -v etcd)" --name m0 --data-dir "$DIR/etcd" \
    --listen-client-urls "http://$ETCD_EP" --advertise-client-urls "http://$ETCD_EP" \
    --listen-peer-urls "http://127.0.0.1:2380" --initial-advertise-peer-urls "http://127.0.0.1:2380" \
    --initial-cluster "m0=http://127.0.0.1:2380" >"$DIR/etcd.log" 2>&1 &
  ETCD_PID=$!
  disown $!
  local _
  for _ in $(seq 100); do
    ip netns exec "${NS_HOST[$1]}" env ETCDCTL_API=3 etcdctl --endpoints "$ETCD_EP" endpoint health >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}
# idist_run_on_host I PATTERN: the pid of the idist-run in host I's namespace whose command
# line matches PATTERN.
idist_run_on_host() {
  pgrep -f "$2" | while read -r p; do
    [ "$(cat /proc/"$p"/comm 2>/dev/null)" = idist-run ] && ip netns identify "$p" 2>/dev/null | grep -qx "${NS_HOST[$1]}" && echo "$p"
  done
}
# Live recovery over hosts: host I's output in $DIR/hI.out and exit code in $DIR/hI.rc, and
# tests/e2e/reform_rank's lines in them ("origin 2 pid 4242", then "origin 2 pid 4242:
# generation 1: ..." from the same process once it re-formed).
origin_pid() { cat "$DIR"/h*.out | awk -v r="$1" '$1 == "origin" && $2 == r && $3 == "pid" {print $4; exit}'; }
host_rc() { cat "$DIR/h$1.rc" 2>/dev/null || echo none; }
same_processes() {
  local origin
  for origin in "$@"; do cat "$DIR"/h*.out | grep -q "^origin $origin pid $(origin_pid "$origin"): generation" || return 1; done
}
wait_for_origins() {
  local i
  for i in $(seq 600); do [ "$(cat "$DIR"/h*.out | grep -c "^origin [0-9]* pid")" -ge "$1" ] && return 0; sleep 0.05; done
  return 1
}
show_hosts() { sed 's/^/  | /' "$DIR/h0.out" "$DIR/h1.out" | tail -60; }

# on_host I NAME CMD...: CMD in host I's namespace with host name NAME (a UTS namespace of its own).
on_host() {
  local i=$1 name=$2
  shift 2
  ip netns exec "${NS_HOST[i]}" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}

# private_copy NAME PROGRAM: a temporary $DIR holding a copy of PROGRAM of this test's own, as
# $DIR/NAME (in $PROG), so that the clean-up at exit, which kills whatever runs from it
# (stopped processes too), can never touch the processes of a test running beside this one.
private_copy() {
  DIR=$(mktemp -d "/tmp/idist-$1.XXXXXX")
  PROG=$DIR/$1
  cp "$(realpath "$2")" "$PROG"
  trap 'pkill -CONT -f "^$PROG " 2>/dev/null; pkill -9 -f "^$PROG " 2>/dev/null; rm -rf "$DIR"' EXIT
}

# recover_programs IDIST_RUN EXAMPLES_DIR RECOVER_CHECK: the live-recovery tests' programs: $RUN,
# and private copies of train_cifar10 ($PROG) and recover_check ($CHECK) in $DIR, made the
# working directory.
recover_programs() {
  RUN=$(realpath "$1")
  private_copy train_cifar10 "$2/train_cifar10"
  CHECK=$DIR/recover_check
  cp "$(realpath "$3")" "$CHECK"
  cd "$DIR" || exit 1
}

# rank_pid PROGRAM R: the pid of the process running PROGRAM as RANK=R (its environment says).
rank_pid() { pgrep -f "^$1 " | while read -r p; do tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$2" && echo "$p"; done | head -1; }

# one_rank_node_replacement NEXT ON WHAT: live recovery's replacement on a node of one rank
# (tests/torch/recover_*netns.sh). NEXT makes the next job, ON I N ARGS... starts host I's
# idist-run of N ranks, WHAT begins the first check's words. Host 1 runs one rank: once it is
# lost, its idist-run waits for the rendezvous' answer (a replacement) before it says it is
# over. Killed at step 8, the replacement is admitted; at step 45 of 48, the job's ranks end
# first, and it is stopped.
one_rank_node_replacement() {
  local next=$1 on=$2 what=$3 at
  for at in 8 45; do
    rm -rf ck
    $next
    $on 0 2 --max-restarts 1 "$CHECK" ck 48 --recover --pause-ms 60 --progress
    sleep 0.3  # host 0 first: on etcd it proposes
    $on 1 1 -v --max-restarts 1 "$CHECK" ck 48 --recover --pause-ms 60 --progress
    wait_for_line h0.out "^step $at$"
    kill -9 "$(rank_pid "$CHECK" 2)"
    wait
    cat h0.out h1.out >out
    if [ $at = 8 ]; then
      check "${what}one rank on host 1, lost at step 8: its replacement is admitted (world 3 -> 2 -> 3), exit 0 on both" \
        eval 'grep -q "^recovered: generation 2 world 3 " h0.out && [ "$(grep -c "succeeded after 2 re-forms" out)" = 2 ]' ||
        grep -h "succeeded\|ended\|place\|^recovered" out
    else
      check "... lost at step 45: its replacement is stopped once the job's ranks end, exit 0 on both" \
        eval 'grep -q "rank 3 (pid [0-9]*) stops: the job.s ranks ended before they admitted it" h1.out && [ "$(grep -c "succeeded after 1 re-form" out)" = 2 ]' ||
        grep -h "succeeded\|ended\|place\|stops" out
    fi
    check "... every step done, every sample once" grep -q "^recover_check: done steps=48 redone=[01] resumed_from=0 seen=3072 " out ||
      grep done out
  done
}

finish() {
  echo "$PASSED passed, $FAILED failed"
  [ "$FAILED" -eq 0 ]
}

# A port for a test's own rendezvous or store: above Linux's ephemeral range (no outgoing
# connection holds it) and above 32767, so never one that idist-run derives from a job id
# (20000-32767 by default) for a test running beside this one (e2e.slurm's jobs).
random_port() {
  local p i
  for i in $(seq 50); do
    p=$((61000 + RANDOM % 4000))
    # Not one another test running beside this one listens on.
    ss -Hltn "sport = :$p" 2>/dev/null | grep -q . || break
  done
  echo $p
}
# Until something listens on 127.0.0.1:PORT (at most 10 s): the node that hosts a rendezvous
# is up before the next one starts, which would otherwise host it in its place.
wait_listening() {
  local i
  for i in $(seq 200); do
    ss -Hltn "sport = :$1" 2>/dev/null | grep -q . && return 0
    sleep 0.05
  done
}
