#!/bin/bash
# The rendezvous on etcd (--rdzv-backend etcd): a real etcd cluster of 3 members on loopback
# ports in a temp dir (killed at the end, whatever happens), idist-run "nodes" on loopback with
# job_sum's ranks checking every sum. Two and three nodes form and finish; the etcd leader
# killed mid-job; the node hosting rank 0 killed (--nnodes 2:3, a restart left): the survivors
# re-form and finish; the proposer's idist-run frozen (SIGSTOP): the others re-form and
# finish, it fails in one line when resumed, saying it was frozen; the job's keys deleted; endpoints
# that answer but not as etcd (a web server, https to a plain member, http to a TLS one, a
# certificate another CA signed): said as what they are; quorum lost: every node fails in one line; a
# rank frozen: the job-wide stall report; TLS with client certificates; two job ids on one etcd; the
# prefix removed at the end; a PyTorchJob's pods with rdzvBackend: etcd (PET_* only); 1,000
# simulated nodes timed (rdzv_scale_etcd, beside JOB_SUM; SCALE_NODES=N for another count).
# usage: rendezvous_etcd.sh IDIST_RUN EXAMPLES_DIR JOB_SUM [CASE...]   (no CASE: every case)
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
EX=$(realpath "$2")
JOB_SUM=$(realpath "$3")
shift 3
CASES=("$@")
ETCD=$(command -v etcd)
ETCDCTL=$(command -v etcdctl)
if [ -z "$ETCD" ] || [ -z "$ETCDCTL" ]; then
  echo "SKIP: etcd or etcdctl not installed (Debian: etcd-server, etcd-client; scripts/setup.sh)"
  exit 77
fi
DIR=$(mktemp -d /tmp/idist-etcd.XXXXXX)
ETCD_PIDS=()
cleanup() {
  for p in "${ETCD_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  pkill -9 -f "rdzv-id etcd-test-$$" 2>/dev/null
  if [ -n "${KEEP:-}" ]; then echo "kept $DIR"; else rm -rf "$DIR"; fi
}
trap cleanup EXIT
export IDIST_TIMEOUT=30
wants() { [ ${#CASES[@]} -eq 0 ] || [[ " ${CASES[*]} " == *" $1 "* ]]; }

# A cluster of 3 members: client ports C[i], peer ports P[i].
base=$(random_port)
C=($base $((base + 1)) $((base + 2)))
P=($((base + 3)) $((base + 4)) $((base + 5)))
cluster="m0=http://127.0.0.1:${P[0]},m1=http://127.0.0.1:${P[1]},m2=http://127.0.0.1:${P[2]}"
ENDPOINTS="127.0.0.1:${C[0]},127.0.0.1:${C[1]},127.0.0.1:${C[2]}"
start_member() {
  local i=$1
  "$ETCD" --name "m$i" --data-dir "$DIR/m$i" --listen-client-urls "http://127.0.0.1:${C[$i]}" \
    --advertise-client-urls "http://127.0.0.1:${C[$i]}" --listen-peer-urls "http://127.0.0.1:${P[$i]}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${P[$i]}" --initial-cluster "$cluster" \
    --initial-cluster-token "idist-$$" --initial-cluster-state new >"$DIR/etcd$i.log" 2>&1 &
  ETCD_PIDS[$i]=$!
  disown $!  # killed by us: no "Killed" line from bash
}
for i in 0 1 2; do start_member $i; done
ctl() { ETCDCTL_API=3 "$ETCDCTL" --endpoints "$ENDPOINTS" --dial-timeout 2s --command-timeout 3s "$@"; }
for _ in $(seq 100); do ctl endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
check "the etcd cluster (3 members) is up" ctl endpoint health

# node NAME NNODES ID [idist-run options...] -- [job_sum args]: in the background; output in
# $DIR/NAME.out, exit code in $DIR/NAME.rc, its subshell's pid in $NODE_PID.
node() {
  local name=$1 nnodes=$2 id=$3
  shift 3
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  rm -f "$DIR/$name.rc"
  (timeout 120 "$RUN" --verbose --rdzv-backend etcd --nnodes "$nnodes" --rdzv-endpoint "$ENDPOINTS" \
     --rdzv-id "etcd-test-$$-$id" -n 2 "${opts[@]}" "${PROGRAM:-$JOB_SUM}" "$@" >"$DIR/$name.out" 2>&1
   echo $? >"$DIR/$name.rc") &
  NODE_PID=$!
}
agent_of() { pgrep -P "$(pgrep -P "$1" timeout)" idist-run; }
rc_of() { cat "$DIR/$1.rc" 2>/dev/null || echo none; }
wait_rc() { for _ in $(seq $((${2:-60} * 10))); do [ -f "$DIR/$1.rc" ] && return; sleep 0.1; done; }
keys_of() { ctl get --prefix "/idist/rdzv/etcd-test-$$-$1/" --keys-only 2>/dev/null | grep -c . || true; }
# Every rank of every node saw the closed-form sum: job_sum prints "ok" lines; WORLD ranks in all.
sums_ok() {
  local world=$1 value=$2
  shift 2
  local all=""
  for n in "$@"; do all+=$(cat "$DIR/$n.out")$'\n'; done
  equals "$(grep -c "^job $value rank [0-9]*/$world .* right$" <<<"$all")" "$world" && ! grep -q WRONG <<<"$all"
}

if wants form; then
  # Two nodes, then three: they form, every sum is right, the job's keys are gone at the end.
  node a 2 two -- 5 10 3; a=$NODE_PID
  node b 2 two -- 5 10 3; b=$NODE_PID
  wait $a $b
  check "two nodes on etcd: both exit 0" equals "$(rc_of a) $(rc_of b)" "0 0" || tail -n 5 "$DIR"/{a,b}.out
  check "two nodes: every rank's sums are right (4 ranks)" sums_ok 4 3 a b || tail -n 5 "$DIR"/{a,b}.out
  check "two nodes: the job's keys are removed" equals "$(keys_of two)" 0
  node a 3 three -- 5 10 3; a=$NODE_PID
  node b 3 three -- 5 10 3; b=$NODE_PID
  node c 3 three -- 5 10 3; c=$NODE_PID
  wait $a $b $c
  check "three nodes on etcd: all exit 0" equals "$(rc_of a) $(rc_of b) $(rc_of c)" "0 0 0" || tail -n 5 "$DIR"/{a,b,c}.out
  check "three nodes: every rank's sums are right (6 ranks)" sums_ok 6 3 a b c
  check "three nodes: the job's keys are removed" equals "$(keys_of three)" 0
  check "rank 0 runs on the node etcd made node 0" equals "$(grep -l "node 0 of 3" "$DIR"/{a,b,c}.out | wc -l)" 1
fi

if wants ids; then
  # Two jobs with different ids on one etcd, at once: each is a job of 2 nodes, not one of 4.
  node a 2 one -- 20 25 3; a=$NODE_PID
  node b 2 one -- 20 25 3; b=$NODE_PID
  node c 2 other -- 20 25 5; c=$NODE_PID
  node d 2 other -- 20 25 5; d=$NODE_PID
  wait $a $b $c $d
  check "two jobs on one etcd: all four nodes exit 0" equals "$(rc_of a)$(rc_of b)$(rc_of c)$(rc_of d)" "0000"
  check "job 'one' has its own 4 ranks, right sums" sums_ok 4 3 a b
  check "job 'other' has its own 4 ranks, right sums" sums_ok 4 5 c d
  check "no node saw a world of 8" equals "$(cat "$DIR"/{a,b,c,d}.out | grep -c "world size 8")" 0
fi

if wants pytorchjob; then
  # A Kubeflow PyTorchJob with rdzvBackend: etcd: the pods have only the operator's variables
  # (PET_RDZV_BACKEND, PET_RDZV_ENDPOINT naming etcd's members, PET_NNODES, ...) and run
  # idist-run with no option, as they would torchrun.
  for name in p q; do
    rm -f "$DIR/$name.rc"
    (env -i PATH="$PATH" HOME="$HOME" IDIST_TIMEOUT=30 PET_RDZV_BACKEND=etcd PET_RDZV_ENDPOINT="$ENDPOINTS" \
       PET_NNODES=2 PET_NPROC_PER_NODE=2 PET_RDZV_ID="etcd-test-$$-pytorchjob" PET_MAX_RESTARTS=1 \
       timeout 120 "$RUN" "$JOB_SUM" 5 10 3 >"$DIR/$name.out" 2>&1
     echo $? >"$DIR/$name.rc") &
    eval "$name=\$!"
  done
  wait $p $q
  check "PyTorchJob pods with PET_RDZV_BACKEND=etcd: both exit 0" equals "$(rc_of p) $(rc_of q)" "0 0" ||
    tail -n 5 "$DIR"/{p,q}.out
  check "... every rank's sums are right (4 ranks)" sums_ok 4 3 p q
  check "... the job's keys are removed" equals "$(keys_of pytorchjob)" 0
fi

leader() {
  local i status
  for i in 0 1 2; do
    status=$(ETCDCTL_API=3 "$ETCDCTL" --endpoints "127.0.0.1:${C[$i]}" endpoint status -w fields 2>/dev/null)
    [ -n "$status" ] && equals "$(sed -n 's/^"MemberID" : //p' <<<"$status")" "$(sed -n 's/^"Leader" : //p' <<<"$status")" &&
      { echo $i; return; }
  done
}

if wants leader; then
  # The etcd leader killed (kill -9) while the job runs: the job goes on and ends correctly.
  node a 2 lead -- 100 50 7; a=$NODE_PID
  node b 2 lead -- 100 50 7; b=$NODE_PID
  wait_for_lines "$DIR/a.out" "attempt 0: node" 1
  sleep 1
  l=$(leader)
  check "the etcd leader is found (member ${l:-?})" test -n "$l"
  [ -n "$l" ] && kill -9 "${ETCD_PIDS[$l]}"
  sleep 2
  [ -f "$DIR/a.rc" ] && touch "$DIR/a.rc.early"
  # An election takes a moment more on a busy machine: up to 10 s.
  for _ in $(seq 50); do l2=$(leader); [ -n "$l2" ] && break; sleep 0.2; done
  check "a new etcd leader was elected (member ${l2:-none}, not $l)" test -n "$l2" -a "$l2" != "$l"
  wait $a $b
  check "leader killed mid-job: both nodes exit 0" equals "$(rc_of a) $(rc_of b)" "0 0" || tail -n 5 "$DIR"/{a,b}.out
  check "leader killed: every rank's sums are right" sums_ok 4 7 a b
  check "leader killed: the job's keys are removed" equals "$(keys_of lead)" 0
  check "leader killed while the job ran (it was still running 2 s after the kill)" test ! -f "$DIR/a.rc.early"
  [ -n "$l" ] && start_member "$l"
  for _ in $(seq 100); do ctl endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
fi

if wants rank0; then
  # The node that hosts rank 0 killed, --nnodes 2:3 and a restart left: the two others re-form
  # and finish with right sums, within 5 s of the kill.
  conf=(--max-restarts 1 --rdzv-conf heartbeat=0.5,node_timeout=2,last_call_timeout=0.5)
  node a 2:3 zero "${conf[@]}" -- 30 50 11; a=$NODE_PID
  node b 2:3 zero "${conf[@]}" -- 30 50 11; b=$NODE_PID
  node c 2:3 zero "${conf[@]}" -- 30 50 11; c=$NODE_PID
  for n in a b c; do wait_for_lines "$DIR/$n.out" "attempt 0: node" 1; done
  sleep 0.3
  zero=$(grep -l "attempt 0: node 0 of 3" "$DIR"/{a,b,c}.out | head -1 | xargs -r basename | cut -d. -f1)
  check "attempt 0 has 3 nodes, one of them node 0 (${zero:-none})" test -n "$zero"
  eval "victim=\$$zero"
  kill_at=$(now_ms)
  # The whole host lost: its idist-run and its ranks at once.
  agent=$(agent_of "$victim")
  kill -9 "$agent" $(pgrep -P "$agent")
  survivors=$(echo a b c | tr ' ' '\n' | grep -v "^$zero$" | tr '\n' ' ')
  for n in $survivors; do wait_for_lines "$DIR/$n.out" "attempt 1: node" 1; done
  formed=$(($(now_ms) - kill_at))
  wait $a $b $c 2>/dev/null
  finished=$(($(now_ms) - kill_at))
  set -- $survivors
  check "rank 0's node killed: the survivors ($survivors) exit 0" equals "$(rc_of $1) $(rc_of $2)" "0 0" || tail -n 8 "$DIR/$1.out" "$DIR/$2.out"
  check "the survivors re-formed as 2 nodes" equals "$(cat "$DIR/$1.out" "$DIR/$2.out" | grep -c "attempt 1: node . of 2")" 2
  check "re-formed within 5 s of the kill (took ${formed} ms)" test "$formed" -lt 5000
  check "and finished within 5 s of the kill (attempt 1: 30 rounds of 50 ms; took $finished ms)" test "$finished" -lt 5000
  check "the survivors' 4 ranks of attempt 1 have right sums" equals "$(cat "$DIR/$1.out" "$DIR/$2.out" | grep -c "^job 11 rank [0-3]/4 .* attempt 1 sum .* right$")" 4
fi

if wants frozen; then
  # The proposer's idist-run frozen (SIGSTOP: a node that stops answering without dying) in a
  # 2:3 job with a restart left: its lease lapses, the next candidate proposes in its place, and
  # the two others re-form and finish; the frozen one, resumed, finds its lease gone and
  # fails in one line rather than rejoin as if nothing happened.
  conf=(--max-restarts 1 --rdzv-conf heartbeat=0.5,node_timeout=2,last_call_timeout=0.5)
  node a 2:3 frozen "${conf[@]}" -- 40 50 13; a=$NODE_PID
  node b 2:3 frozen "${conf[@]}" -- 40 50 13; b=$NODE_PID
  node c 2:3 frozen "${conf[@]}" -- 40 50 13; c=$NODE_PID
  for n in a b c; do wait_for_lines "$DIR/$n.out" "attempt 0: node" 1; done
  # The proposer: the first candidate of the election, valued its id, HOST-PID-RANDOM: the pid of its idist-run.
  proposer=$(ctl get --prefix "/idist/rdzv/etcd-test-$$-frozen/election/" --sort-by=CREATE --order=ASCEND --limit=1 \
    --print-value-only | tr -d '"')
  agent=$(echo "$proposer" | awk -F- '{print $(NF-1)}')
  frozen=none
  for n in a b c; do eval "[ \"\$(agent_of \$$n)\" = \"$agent\" ] && frozen=$n"; done
  check "the proposer ($proposer) is one of the three nodes' idist-run ($frozen)" test "$frozen" != none
  others=$(echo a b c | tr ' ' '\n' | grep -v "^$frozen$" | tr '\n' ' ')
  set -- $others
  kill -STOP "$agent"
  stopped_at=$(now_ms)
  for n in $others; do wait_for_lines "$DIR/$n.out" "attempt 1: node" 1; done
  formed=$(($(now_ms) - stopped_at))
  eval "wait \$$1 \$$2"
  kill -CONT "$agent"
  wait_rc "$frozen" 30
  check "proposer's idist-run frozen: the two others ($others) exit 0" equals "$(rc_of $1) $(rc_of $2)" "0 0" ||
    tail -n 8 "$DIR/$1.out" "$DIR/$2.out"
  check "... re-formed as 2 nodes within node_timeout and 3 s (took $formed ms)" test "$formed" -lt 5000
  check "... the next candidate took the proposer's place" equals "$(cat "$DIR/$1.out" "$DIR/$2.out" | grep -c "proposes the job's next states now")" 1
  check "... their 4 ranks of attempt 1 have right sums" equals "$(cat "$DIR/$1.out" "$DIR/$2.out" | grep -c "^job 13 rank [0-3]/4 .* attempt 1 sum .* right$")" 4
  check "the frozen node, resumed, exits non-zero (got $(rc_of $frozen))" test "$(rc_of $frozen)" != 0 -a "$(rc_of $frozen)" != none
  # Its own freeze, measured by its heartbeat loop, not etcd's fault.
  check "... with a line saying it was frozen past its lease" \
    eval 'grep -qE "this node was frozen for [0-9.]+s \(its idist-run did not run\), past its etcd lease of 2s" "$DIR/$frozen.out"' ||
    tail -n 4 "$DIR/$frozen.out"
  check "... and no line blaming etcd for it" eval '! grep -q "no heartbeat reached etcd" "$DIR/$frozen.out"'
fi

if wants wipe; then
  # The job's keys deleted while it runs (etcdctl del, a restore from an older snapshot): each
  # node says the keys are gone, not that a heartbeat failed.
  node a 2 wipe --rdzv-conf heartbeat=0.5,node_timeout=2 -- 400 50 3; a=$NODE_PID
  node b 2 wipe --rdzv-conf heartbeat=0.5,node_timeout=2 -- 400 50 3; b=$NODE_PID
  wait_for_lines "$DIR/a.out" "attempt 0: node" 1
  wait_for_lines "$DIR/b.out" "attempt 0: node" 1
  ctl del --prefix "/idist/rdzv/etcd-test-$$-wipe/" >/dev/null
  wait_rc a 30
  wait_rc b 30
  check "the job's keys deleted: both nodes fail (exit $(rc_of a), $(rc_of b))" \
    test "$(rc_of a)" != 0 -a "$(rc_of b)" != 0 -a "$(rc_of a)" != none -a "$(rc_of b)" != none
  check "... each saying the keys are gone" equals \
    "$(grep -l "the job's keys are gone from etcd (deleted or compacted)" "$DIR"/{a,b}.out | wc -l)" 2 ||
    tail -n 4 "$DIR"/{a,b}.out
  check "... and no line blaming a heartbeat" eval '! grep -q "no heartbeat" "$DIR"/{a,b}.out'
fi

# what_answered NAME ENDPOINT [CONF]: a node alone at ENDPOINT (with --rdzv-conf CONF), its exit
# code and last line.
what_answered() {
  local name=$1 endpoint=$2 conf=${3:+,$3}
  IDIST_TIMEOUT=3 timeout 30 "$RUN" --rdzv-backend etcd --nnodes 2 --rdzv-endpoint "$endpoint" \
    --rdzv-id "etcd-test-$$-$name" --rdzv-conf "node_timeout=2$conf" -n 1 /bin/true >"$DIR/$name.out" 2>&1
  echo "$? $(tail -n 1 "$DIR/$name.out")"
}

if wants answers; then
  # Endpoints that answer, but not as etcd does: said as what they are, in one line, never as
  # "no answer" and never with the page they answered.
  hport=$(random_port)
  python3 -m http.server "$hport" --bind 127.0.0.1 --directory "$DIR" >/dev/null 2>&1 &
  HTTP_PID=$!
  disown $!
  for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$hport) 2>/dev/null && break; sleep 0.1; done
  got=$(what_answered web "127.0.0.1:$hport")
  check "a web server as etcd: exit 1, 'not an etcd member (HTTP 501 from ...)': $got" \
    eval '[ "${got%% *}" = 1 ] && grep -q "not an etcd member (HTTP 501 from 127.0.0.1:$hport)" <<<"$got"'
  check "... no 'no answer', no HTML" eval '! grep -qiE "no answer|<html|DOCTYPE" "$DIR/web.out"'
  check "... in one line" equals "$(grep -c "127.0.0.1:$hport" "$DIR/web.out")" 1 || cat "$DIR/web.out"
  got=$(what_answered plain "https://127.0.0.1:${C[0]}")
  check "https:// to a plain etcd member: 'TLS failed: ... give http://': $got" \
    eval '[ "${got%% *}" = 1 ] && grep -q "127.0.0.1:${C[0]}: TLS failed: .*give http://" <<<"$got" && ! grep -q "no answer" <<<"$got"'
  kill -9 "$HTTP_PID" 2>/dev/null
fi

if wants errors; then
  # A node alone (the other never comes): it fails within IDIST_TIMEOUT, naming what joined.
  start=$(now_ms)
  out=$(IDIST_TIMEOUT=2 timeout 60 "$RUN" --rdzv-backend etcd --nnodes 2 --rdzv-endpoint "$ENDPOINTS" \
        --rdzv-id "etcd-test-$$-alone" -n 1 /bin/true 2>&1)
  rc=$?
  took=$(($(now_ms) - start))
  check "a node alone fails (exit $rc)" equals "$rc" 1
  check "it says the rendezvous timed out with 1 of 2 nodes" contains "$out" "the rendezvous timed out after 2s: 1 of 2 nodes joined"
  check "within the timeout and a margin (took $took ms)" test "$took" -lt 6000
  check "it leaves no key behind" equals "$(keys_of alone)" 0 || ctl get --prefix "/idist/rdzv/etcd-test-$$-alone/" 2>&1 | sed "s/^/  | /"
  # No etcd at all: one line naming the endpoints, within node_timeout.
  dead=$(random_port)
  start=$(now_ms)
  out=$(timeout 60 "$RUN" --rdzv-backend etcd --nnodes 2 --rdzv-endpoint "127.0.0.1:$dead,127.0.0.1:$((dead + 1))" \
        --rdzv-id "etcd-test-$$-none" --rdzv-conf node_timeout=2 -n 1 /bin/true 2>&1)
  rc=$?
  took=$(($(now_ms) - start))
  check "no etcd: exit 1 (got $rc)" equals "$rc" 1
  check "no etcd: the last line names both endpoints" contains "$(tail -n 1 <<<"$out")" "127.0.0.1:$dead, 127.0.0.1:$((dead + 1))"
  check "no etcd: within node_timeout and a margin (took $took ms)" test "$took" -lt 5000
  # Usage errors: one line, exit 2.
  for bad in "--rdzv-backend nope" "--rdzv-endpoint h:x" "--rdzv-conf cert=/c.pem" "--node-rank 0"; do
    out=$("$RUN" --rdzv-backend etcd --nnodes 2 --rdzv-endpoint "$ENDPOINTS" --rdzv-id x $bad /bin/true 2>&1)
    rc=$?
    check "'$bad' with etcd: exit 2, one line" equals "$rc $(wc -l <<<"$out")" "2 1" || echo "$out"
  done
fi

if wants scale; then
  # 1,000 simulated nodes (one process) through the cluster: every assignment right, timed
  # (the figure is printed, not held to: a benchmark, bench/rdzv_etcd.sh, measures it).
  SCALE=$(dirname "$JOB_SUM")/rdzv_scale_etcd
  n=${SCALE_NODES:-1000}
  if [ -x "$SCALE" ]; then
    out=$(timeout 120 "$SCALE" "$ENDPOINTS" "etcd-test-$$-scale" "$n" 2>&1)
    check "$n simulated nodes through etcd: every one assigned, none wrong" contains "$out" "$n assigned, 0 failed, 0 wrong"
    echo "  ($out)"
    ctl del --prefix "/idist/rdzv/etcd-test-$$-scale/" >/dev/null
  else
    echo "# rdzv_scale_etcd not built: the scale case skipped"
  fi
fi

if wants stall; then
  # A rank of one node frozen (SIGSTOP): the other node sees only its own ranks waiting, asks
  # through etcd, and both nodes print the job-wide report, which names the frozen rank.
  PROGRAM=$(dirname "$JOB_SUM")/stall_rank
  node a 2 stall --stall-timeout 2 --timeout 40 -- loop 400 20; a=$NODE_PID
  sleep 0.3
  node b 2 stall --stall-timeout 2 --timeout 40 -- loop 400 20; b=$NODE_PID
  PROGRAM=
  for _ in $(seq 400); do grep -q "^rank 3 pid" "$DIR/a.out" "$DIR/b.out" 2>/dev/null && break; sleep 0.05; done
  pid=$(awk '$1 == "rank" && $2 == 3 && $3 == "pid" {print $4; exit}' "$DIR/a.out" "$DIR/b.out")
  other=$(grep -L "^rank 3 pid" "$DIR/a.out" "$DIR/b.out" | head -1)
  sleep 0.5
  kill -STOP "$pid"
  start=$(now_ms)
  while ! grep -q "stall (job-wide)" "$other" && [ $(($(now_ms) - start)) -lt 10000 ]; do sleep 0.05; done
  took=$(($(now_ms) - start))
  sleep 0.5
  kill -CONT "$pid"
  wait $a $b
  grep -h "stall (job-wide)" "$DIR/a.out" "$DIR/b.out" | sed 's/^/  | /'
  check "rank 3 frozen: the node without it prints the job-wide report after $took ms (bound 7000)" eval \
    '[ $took -lt 7000 ] && grep -qE "stall \(job-wide\): all_reduce #[0-9]+ on group world .*rank 3 (never entered it|waiting [0-9.]+ s \(state: stopped)" "$other"'
  check "... and the node with it the same (both print it)" equals \
    "$(grep -lE "stall \(job-wide\): .*rank 3 (never entered it|waiting [0-9.]+ s \(state: stopped)" "$DIR/a.out" "$DIR/b.out" | wc -l)" 2
  check "... and the job still ends: both nodes exit 0" equals "$(rc_of a) $(rc_of b)" "0 0" || tail -n 5 "$DIR"/{a,b}.out
fi

if wants tls; then
  # etcd over TLS with client certificates (--client-cert-auth), a member of its own: a CA, the
  # member's certificate for 127.0.0.1, one client's. Two nodes form and finish over https;
  # without a client certificate, or trusting another CA, a node fails in one line.
  if ! command -v openssl >/dev/null; then
    echo "# SKIP tls: no openssl to make certificates (Debian: openssl)"
  else
    T=$DIR/tls
    mkdir -p "$T"
    cert() {  # cert NAME SUBJECT [SAN]: NAME.key and NAME.pem signed by $T/ca (or self-signed: ca)
      local name=$1 subject=$2 san=${3:-}
      openssl req -new -newkey rsa:2048 -nodes -keyout "$T/$name.key" -subj "$subject" -out "$T/$name.csr" 2>/dev/null
      if [ "$name" = ca ] || [ "$name" = other ]; then
        openssl x509 -req -in "$T/$name.csr" -signkey "$T/$name.key" -days 2 -out "$T/$name.pem" \
          -extfile <(printf 'basicConstraints=critical,CA:true\nkeyUsage=keyCertSign,cRLSign\n') 2>/dev/null
      else
        openssl x509 -req -in "$T/$name.csr" -CA "$T/ca.pem" -CAkey "$T/ca.key" -CAcreateserial -days 2 \
          -out "$T/$name.pem" -extfile <(printf '%s\n' "${san:+subjectAltName=$san}" "extendedKeyUsage=serverAuth,clientAuth") 2>/dev/null
      fi
    }
    cert ca "/CN=idist test CA"
    cert other "/CN=another CA"
    cert server "/CN=etcd" "IP:127.0.0.1"
    cert client "/CN=idist"
    tport=$(random_port)
    "$ETCD" --name tls --data-dir "$DIR/tls-data" --listen-client-urls "https://127.0.0.1:$tport" \
      --advertise-client-urls "https://127.0.0.1:$tport" --listen-peer-urls "http://127.0.0.1:$((tport + 1))" \
      --initial-advertise-peer-urls "http://127.0.0.1:$((tport + 1))" --initial-cluster "tls=http://127.0.0.1:$((tport + 1))" \
      --cert-file "$T/server.pem" --key-file "$T/server.key" --trusted-ca-file "$T/ca.pem" --client-cert-auth \
      >"$DIR/etcd-tls.log" 2>&1 &
    ETCD_PIDS[3]=$!
    disown $!
    for _ in $(seq 100); do
      ETCDCTL_API=3 "$ETCDCTL" --endpoints "https://127.0.0.1:$tport" --cacert "$T/ca.pem" --cert "$T/client.pem" \
        --key "$T/client.key" endpoint health >/dev/null 2>&1 && break
      sleep 0.1
    done
    tls_node() {  # tls_node NAME [--rdzv-conf ...]: 2 ranks of job_sum on the TLS member
      local name=$1
      shift
      rm -f "$DIR/$name.rc"
      (timeout 60 "$RUN" --rdzv-backend etcd --nnodes 2 --rdzv-endpoint "https://127.0.0.1:$tport" \
         --rdzv-id "etcd-test-$$-tls" -n 2 "$@" "$JOB_SUM" 5 10 3 >"$DIR/$name.out" 2>&1
       echo $? >"$DIR/$name.rc") &
      NODE_PID=$!
    }
    conf="cacert=$T/ca.pem,cert=$T/client.pem,key=$T/client.key"
    tls_node a --rdzv-conf "$conf"; a=$NODE_PID
    tls_node b --rdzv-conf "$conf"; b=$NODE_PID
    wait $a $b
    check "etcd over TLS with client certificates: both nodes exit 0" equals "$(rc_of a) $(rc_of b)" "0 0" ||
      tail -n 5 "$DIR"/{a,b}.out "$DIR/etcd-tls.log"
    check "... every rank's sums are right (4 ranks)" sums_ok 4 3 a b
    out=$(IDIST_TIMEOUT=3 timeout 30 "$RUN" --rdzv-backend etcd --nnodes 2 --rdzv-endpoint "https://127.0.0.1:$tport" \
          --rdzv-id "etcd-test-$$-tls2" --rdzv-conf "cacert=$T/ca.pem,node_timeout=2" -n 1 /bin/true 2>&1)
    rc=$?
    check "no client certificate: exit 1 (got $rc), the last line names the member" \
      eval '[ $rc = 1 ] && tail -n 1 <<<"$out" | grep -q "127.0.0.1:$tport"' || echo "$out" | tail -n 2
    out=$(IDIST_TIMEOUT=3 timeout 30 "$RUN" --rdzv-backend etcd --nnodes 2 --rdzv-endpoint "https://127.0.0.1:$tport" \
          --rdzv-id "etcd-test-$$-tls3" --rdzv-conf "cacert=$T/other.pem,cert=$T/client.pem,key=$T/client.key,node_timeout=2" \
          -n 1 /bin/true 2>&1)
    rc=$?
    check "a member whose certificate another CA signed: exit 1 (got $rc), saying the check failed and why" \
      eval '[ $rc = 1 ] && tail -n 1 <<<"$out" | grep -q "TLS failed: certificate verify failed (unable to get local issuer certificate)" && ! grep -q "no answer" <<<"$out"' ||
      echo "$out" | tail -n 2
    got=$(what_answered tls4 "http://127.0.0.1:$tport")
    check "http:// to a TLS member: 'a TLS server ... give https://': $got" \
      eval '[ "${got%% *}" = 1 ] && grep -q "127.0.0.1:$tport: .*a TLS server.*give https://" <<<"$got" && ! grep -q "no answer" <<<"$got"'
    if command -v openssl >/dev/null; then
      # A TLS server that is not etcd (openssl s_server): the handshake works, the answer is not HTTP.
      sport=$(random_port)
      openssl s_server -accept "$sport" -cert "$T/server.pem" -key "$T/server.key" -quiet </dev/null >/dev/null 2>&1 &
      S_PID=$!
      disown $!
      sleep 0.5
      got=$(what_answered sserver "https://127.0.0.1:$sport" "cacert=$T/ca.pem")
      check "a TLS server that is not etcd: not 'no answer': $got" eval '[ "${got%% *}" = 1 ] && ! grep -q "no answer" <<<"$got"'
      got=$(what_answered sserver2 "http://127.0.0.1:$sport")
      check "http:// to a TLS server that is not etcd: 'a TLS server': $got" \
        eval '[ "${got%% *}" = 1 ] && grep -q "a TLS server" <<<"$got"'
      kill -9 "$S_PID" 2>/dev/null
    fi
    out=$("$RUN" --rdzv-backend etcd --nnodes 2 --rdzv-endpoint "https://127.0.0.1:$tport" --rdzv-id x \
          --rdzv-conf "cacert=$T/missing.pem" /bin/true 2>&1)
    rc=$?
    check "a cacert that is not there: exit 2, one line naming it" \
      eval '[ $rc = 2 ] && [ $(wc -l <<<"$out") = 1 ] && grep -q "missing.pem" <<<"$out"' || echo "$out"
    kill -9 "${ETCD_PIDS[3]}" 2>/dev/null
  fi
fi

if wants quorum; then
  # Quorum lost (2 of 3 members down): every node fails in one line, within the timeout.
  node a 2 quorum --rdzv-conf heartbeat=0.5,node_timeout=3 -- 400 50 3; a=$NODE_PID
  node b 2 quorum --rdzv-conf heartbeat=0.5,node_timeout=3 -- 400 50 3; b=$NODE_PID
  wait_for_lines "$DIR/a.out" "attempt 0: node" 1
  wait_for_lines "$DIR/b.out" "attempt 0: node" 1
  kill -9 "${ETCD_PIDS[1]}" "${ETCD_PIDS[2]}"
  lost_at=$(now_ms)
  wait_rc a 30
  wait_rc b 30
  took=$(($(now_ms) - lost_at))
  check "quorum lost: both nodes fail (exit $(rc_of a), $(rc_of b))" test "$(rc_of a)" != 0 -a "$(rc_of b)" != 0 -a "$(rc_of a)" != none
  # The bound: the member left may be the leader, which renews leases until it steps down
  # (an election timeout, 1 s, later); then node_timeout (3 s) of silence, and a renewal
  # already on its way is waited for a heartbeat (0.5 s) more, checked at the next beat.
  check "quorum lost: within 1 s + node_timeout (3 s) + 2 heartbeats and a margin (took ${took} ms; at most 6000)" \
    test "$took" -lt 6000
  for n in a b; do
    check "node $n ends with one line naming etcd's endpoints" equals "$(tail -n 2 "$DIR/$n.out" | grep -c "lost etcd.*127.0.0.1:${C[1]}")" 1 || tail -n 5 "$DIR/$n.out"
  done
  start_member 1
  start_member 2
fi

finish
