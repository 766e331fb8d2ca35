#!/bin/bash
# Bad input, as a table. Every row is one malformed input: a command-line option, a config
# file, an env contract value, a launcher's variable set, or bytes a stranger sends the store.
# A row passes when:
#   - idist-run exits 2 (a program's idist::init() raises, and the program exits 1),
#   - stderr is exactly one line, and it names the bad input,
#   - it took under 5 s, and
#   - no process is left that carries the row's marker in its environment.
# Store rows instead check that the store logs one line naming the peer and that the job it
# serves still completes with the right result.
#
# usage: bad_input.sh IDIST_RUN EXAMPLES_DIR
source "$(dirname "$0")/lib.sh"
RUN=$1
EX=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
touch "$TMP/not-executable"
ROW=0

# Each row runs in an empty environment plus its own variables, so that nothing from the
# caller's shell (a SLURM allocation, a stale RANK) changes what it sees.
clean_env() { env -i PATH="$PATH" HOME="${HOME:-/root}" IDIST_BAD_INPUT_ROW="$MARKER.$ROW" "$@"; }

# verdict MS WHY PASSED FAILED: the checks every row ends with (under 5 s, nothing left of the
# row), then one line: PASSED, or FAILED with every reason (WHY holds those found so far).
verdict() {
  local ms=$1 why=$2
  [ "$ms" -lt 5000 ] || why+=" took ${ms} ms;"
  no_env_leftovers "IDIST_BAD_INPUT_ROW=$MARKER.$ROW" || why+=" left processes behind;"
  if [ -z "$why" ]; then
    check "$3" true
  else
    check "${4/\{why\}/$why}" false
  fi
}

# row KIND WHAT WANT_RC NEEDLE CMD...
row() {
  local kind=$1 what=$2 want_rc=$3 needle=$4
  shift 4
  ROW=$((ROW + 1))
  local start err rc ms why=""
  local vars=()
  while [[ $# -gt 0 && $1 == [A-Za-z_]*=* ]]; do
    vars+=("$1")
    shift
  done
  start=$(now_ms)
  err=$(clean_env "${vars[@]}" timeout 20 "$@" 2>&1 >/dev/null)
  rc=$?
  ms=$(($(now_ms) - start))
  [ "$rc" = "$want_rc" ] || why+=" exit $rc, not $want_rc;"
  [ -n "$err" ] && [ "$(wc -l <<<"$err")" = 1 ] || why+=" stderr is not one line;"
  contains "$err" "$needle" || why+=" stderr does not name '$needle';"
  verdict "$ms" "$why" "[$kind] $what -> $rc in ${ms} ms: $err" \
    "[$kind] $what:{why} stderr was: $(head -c 400 <<<"$err" | tr '\n' '|')"
}

# A launcher's row: idist-run under VARS..., exits 2.
launcher_row() {
  local kind=$1 what=$2 needle=$3
  shift 3
  row "$kind" "$what" 2 "$needle" "$@" "$RUN" /bin/true
}

# A library row: the tutorial's all_reduce started by hand with a bad env contract; init()
# raises, the example prints what() and exits 1.
lib_row() {
  local what=$1 needle=$2
  shift 2
  row env "$what" 1 "$needle" MASTER_ADDR=127.0.0.1 MASTER_PORT=$((10000 + RANDOM % 10000)) IDIST_TIMEOUT=2 \
    "$@" "$EX/all_reduce"
}

echo "# command line"
row cli "-n 0" 2 "--nproc-per-node 0" "$RUN" -n 0 /bin/true
row cli "-n abc" 2 "'abc'" "$RUN" -n abc /bin/true
row cli "-n 5000" 2 "--nproc-per-node 5000" "$RUN" -n 5000 /bin/true
row cli "-n without a value" 2 "--nproc-per-node" "$RUN" -n
row cli "an unknown option" 2 "--bogus" "$RUN" --bogus /bin/true
row cli "no program" 2 "no program given" "$RUN" -n 2
row cli "a missing program" 2 "/nonexistent/prog" "$RUN" /nonexistent/prog
row cli "a program not in PATH" 2 "no-such-program-xyz" "$RUN" no-such-program-xyz
row cli "a program that is not executable" 2 "$TMP/not-executable" "$RUN" "$TMP/not-executable"
row cli "a directory as the program" 2 "is a directory" "$RUN" "$TMP"
row cli "--master-port 70000" 2 "70000" "$RUN" --master-port 70000 /bin/true
row cli "--master-port abc" 2 "--master-port" "$RUN" --master-port abc /bin/true
row cli "an unresolvable --master-addr" 2 "no-such-host.invalid" "$RUN" -n 2 --master-addr no-such-host.invalid /bin/true
row cli "--backend tpu" 2 "tpu" "$RUN" --backend tpu /bin/true
row cli "--backend mpi spawned by idist-run" 2 "--backend mpi" "$RUN" -n 2 --backend mpi /bin/true
row cli "--launcher pbs" 2 "pbs" "$RUN" --launcher pbs /bin/true
row cli "--launcher slurm outside SLURM" 2 "--launcher slurm" "$RUN" --launcher slurm /bin/true
row cli "--nnodes 0" 2 "--nnodes 0" "$RUN" --nnodes 0 /bin/true
row cli "--nnodes 2 without --master-addr" 2 "--master-addr" "$RUN" --nnodes 2 --node-rank 1 /bin/true
row cli "--node-rank 2 of --nnodes 2" 2 "--node-rank 2" "$RUN" --nnodes 2 --node-rank 2 --master-addr 127.0.0.1 /bin/true
row cli "--grace -1" 2 "--grace" "$RUN" --grace -1 /bin/true
row cli "--timeout 0" 2 "--timeout 0" "$RUN" --timeout 0 /bin/true
row cli "--timeout soon" 2 "--timeout 'soon'" "$RUN" --timeout soon /bin/true
row cli "--max-restarts -1" 2 "--max-restarts" "$RUN" --max-restarts -1 /bin/true
row cli "--forward-signals KILL" 2 "'KILL'" "$RUN" --forward-signals KILL /bin/true
row cli "--port-range reversed" 2 "30000-20000" "$RUN" --port-range 30000-20000 /bin/true
row cli "--log-dir that cannot be made" 2 "/proc/nope" "$RUN" --log-dir /proc/nope /bin/true
row cli "IDIST_PORT_RANGE=abc" 2 "IDIST_PORT_RANGE" IDIST_PORT_RANGE=abc "$RUN" /bin/true
row cli "IDIST_BACKEND=tpu for idist-run" 2 "IDIST_BACKEND" IDIST_BACKEND=tpu "$RUN" /bin/true
row cli "IDIST_NO_DETECT=maybe" 2 "IDIST_NO_DETECT='maybe'" IDIST_NO_DETECT=maybe "$RUN" /bin/true
# An empty value, wherever it comes from, is refused naming it (never taken as unset).
row cli "--rdzv-id ''" 2 "--rdzv-id is empty: leave it out or give the job's id" "$RUN" --rdzv-id '' /bin/true
row cli "IDIST_LOG_DIR=''" 2 "IDIST_LOG_DIR is set but empty: unset it or give a directory" IDIST_LOG_DIR= "$RUN" /bin/true
RDZV=(--nnodes 2 --rdzv-endpoint 127.0.0.1:1 --rdzv-id bad-input)
row cli "--rdzv-conf prefix=''" 2 "--rdzv-conf prefix is empty" "$RUN" "${RDZV[@]}" --rdzv-backend etcd \
  --rdzv-conf prefix= /bin/true
# A number too large is said as too large, with the limit; the value named by its own option.
row cli "--rdzv-conf join_timeout=1e9" 2 "--rdzv-conf join_timeout=1e9 is too large: at most 1000000 s" "$RUN" \
  "${RDZV[@]}" --rdzv-conf join_timeout=1e9 /bin/true
row cli "--timeout 1e99" 2 "--timeout 1e99 is too large: at most 1000000000 s" "$RUN" --timeout 1e99 /bin/true
row cli "an unresolvable --rdzv-conf local_addr" 2 "cannot resolve --rdzv-conf local_addr 'no-such-host.invalid'" \
  "$RUN" "${RDZV[@]}" --rdzv-backend etcd --rdzv-conf local_addr=no-such-host.invalid /bin/true

echo "# config files"
printf '{"nproc_per_node": 2, "bogus_key": 1}' >"$TMP/unknown.json"
printf '{"nproc_per_node": "two"}' >"$TMP/type.json"
printf '{"nproc_per_node": 0}' >"$TMP/range.json"
printf '{"nproc_per_node": 2,\n "tag_output": tru }' >"$TMP/syntax.json"
printf '[1, 2]' >"$TMP/array.json"
row config "a missing file" 2 "$TMP/missing.json" "$RUN" --config "$TMP/missing.json" /bin/true
row config "an unknown key" 2 "bogus_key" "$RUN" --config "$TMP/unknown.json" /bin/true
row config "a string where a number belongs" 2 "nproc_per_node" "$RUN" --config "$TMP/type.json" /bin/true
row config "nproc_per_node 0" 2 "0" "$RUN" --config "$TMP/range.json" /bin/true
row config "invalid JSON" 2 "line 2" "$RUN" --config "$TMP/syntax.json" /bin/true
row config "an array, not an object" 2 "$TMP/array.json" "$RUN" --config "$TMP/array.json" /bin/true
# Nested 100,000 deep: quoting it in the error overflowed the stack (SIGSEGV); 30,000 did not.
for depth in 100000 30000; do
  { head -c $depth /dev/zero | tr '\0' '['; head -c $depth /dev/zero | tr '\0' ']'; } >"$TMP/deep$depth.json"
  row config "arrays nested $depth deep" 2 "$TMP/deep$depth.json" "$RUN" --config "$TMP/deep$depth.json" /bin/true
done
row config "IDIST_NPROC_PER_NODE=abc" 2 "IDIST_NPROC_PER_NODE" IDIST_NPROC_PER_NODE=abc "$RUN" /bin/true

echo "# env contract, seen by idist-run (torchrun-style variables)"
launcher_row env "RANK=abc" "RANK='abc'" RANK=abc WORLD_SIZE=2
launcher_row env "RANK >= WORLD_SIZE" "RANK=2" RANK=2 WORLD_SIZE=2
launcher_row env "WORLD_SIZE=0" "WORLD_SIZE='0'" RANK=0 WORLD_SIZE=0
launcher_row env "MASTER_PORT=70000" "MASTER_PORT='70000'" RANK=0 WORLD_SIZE=2 MASTER_PORT=70000

echo "# env contract, seen by the library (idist::init)"
lib_row "RANK=abc" "RANK='abc'" RANK=abc WORLD_SIZE=2
lib_row "WORLD_SIZE=0" "WORLD_SIZE='0'" RANK=0 WORLD_SIZE=0
lib_row "RANK >= WORLD_SIZE" "RANK='2'" RANK=2 WORLD_SIZE=2
lib_row "RANK=-1" "RANK='-1'" RANK=-1 WORLD_SIZE=2
lib_row "WORLD_SIZE beyond int" "WORLD_SIZE='99999999999'" RANK=0 WORLD_SIZE=99999999999
lib_row "WORLD_SIZE without RANK" "RANK is not set" WORLD_SIZE=2
lib_row "MASTER_PORT=70000" "MASTER_PORT='70000'" RANK=0 WORLD_SIZE=2 MASTER_PORT=70000
lib_row "MASTER_PORT=abc" "MASTER_PORT='abc'" RANK=0 WORLD_SIZE=2 MASTER_PORT=abc
lib_row "MASTER_ADDR empty" "MASTER_ADDR=''" RANK=0 WORLD_SIZE=2 MASTER_ADDR=
lib_row "an unresolvable MASTER_ADDR (rank 0)" "no-such-host.invalid" RANK=0 WORLD_SIZE=2 MASTER_ADDR=no-such-host.invalid
lib_row "an unresolvable MASTER_ADDR (rank 1)" "no-such-host.invalid" RANK=1 WORLD_SIZE=2 MASTER_ADDR=no-such-host.invalid
lib_row "LOCAL_RANK >= LOCAL_WORLD_SIZE" "LOCAL_RANK='3'" RANK=0 WORLD_SIZE=2 LOCAL_RANK=3 LOCAL_WORLD_SIZE=2
lib_row "IDIST_BACKEND=tpu" "IDIST_BACKEND='tpu'" RANK=0 WORLD_SIZE=2 IDIST_BACKEND=tpu
lib_row "IDIST_TIMEOUT=soon" "IDIST_TIMEOUT='soon'" RANK=0 WORLD_SIZE=2 IDIST_TIMEOUT=soon
lib_row "IDIST_DEBUG=maybe" "IDIST_DEBUG='maybe'" RANK=0 WORLD_SIZE=2 IDIST_DEBUG=maybe
lib_row "IDIST_INTRANODE=fast" "IDIST_INTRANODE='fast'" RANK=0 WORLD_SIZE=2 IDIST_INTRANODE=fast
lib_row "IDIST_CPUS_SHARED=sometimes" "IDIST_CPUS_SHARED='sometimes'" RANK=0 WORLD_SIZE=2 IDIST_CPUS_SHARED=sometimes

echo "# Kubeflow PyTorchJob pods (PET_*)"
launcher_row pod "PET_NNODES alone" "PET_NNODES is set but RANK and WORLD_SIZE are not" PET_NNODES=2
launcher_row pod "PET_RDZV_ID empty" "PET_RDZV_ID is set but empty: unset it or give the job's id" PET_RDZV_ID= \
  PET_RDZV_ENDPOINT=127.0.0.1:1 PET_RDZV_BACKEND=c10d PET_NNODES=2
launcher_row pod "PET_RDZV_ENDPOINT empty" "PET_RDZV_ENDPOINT is set but empty" PET_RDZV_ENDPOINT= PET_NNODES=2

echo "# SLURM variable sets"
STEP=(SLURM_JOB_ID=7 SLURM_STEP_ID=0 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_STEP_NUM_TASKS=2
  SLURM_STEP_NUM_NODES=1 SLURM_STEP_TASKS_PER_NODE=2 SLURM_STEP_NODELIST=n1)
launcher_row slurm "a reversed range in the node list" "'3-1'" "${STEP[@]}" SLURM_STEP_NODELIST='n[3-1]'
launcher_row slurm "an unbalanced bracket in the node list" "unbalanced '['" "${STEP[@]}" SLURM_STEP_NODELIST='n[1-2'
launcher_row slurm "more hosts than nodes" "has 2 hosts" "${STEP[@]}" SLURM_STEP_NODELIST='n[1-2]'
launcher_row slurm "tasks per node that do not add up" "adds up to 3 tasks" "${STEP[@]}" SLURM_STEP_TASKS_PER_NODE=3
launcher_row slurm "a broken repeat in tasks per node" "'2(x'" "${STEP[@]}" SLURM_STEP_TASKS_PER_NODE='2(x'
launcher_row slurm "SLURM_PROCID beyond the tasks" "SLURM_PROCID=5" "${STEP[@]}" SLURM_PROCID=5
launcher_row slurm "SLURM_PROCID=abc" "SLURM_PROCID='abc'" "${STEP[@]}" SLURM_PROCID=abc
launcher_row slurm "SLURM_NODEID beyond the nodes" "SLURM_NODEID=3" "${STEP[@]}" SLURM_NODEID=3
launcher_row slurm "node counts that disagree" "SLURM_STEP_NUM_NODES=2" "${STEP[@]}" SLURM_STEP_NUM_NODES=2
launcher_row slurm "SLURM_LOCALID beyond the node's tasks" "SLURM_LOCALID=2" "${STEP[@]}" SLURM_LOCALID=2
launcher_row slurm "SLURM and PMI ranks that disagree" "disagree" "${STEP[@]}" PMI_RANK=1 PMI_SIZE=2

echo "# MPI and horovodrun variable sets"
OMPI=(OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=0 OMPI_COMM_WORLD_LOCAL_SIZE=2
  OMPI_COMM_WORLD_NODE_RANK=0)
launcher_row mpi "OMPI rank = size" "OMPI_COMM_WORLD_RANK=2" "${OMPI[@]}" OMPI_COMM_WORLD_RANK=2
launcher_row mpi "OMPI size 0" "OMPI_COMM_WORLD_SIZE='0'" "${OMPI[@]}" OMPI_COMM_WORLD_SIZE=0
launcher_row mpi "OMPI local rank abc" "OMPI_COMM_WORLD_LOCAL_RANK='abc'" "${OMPI[@]}" OMPI_COMM_WORLD_LOCAL_RANK=abc
launcher_row mpi "OMPI local size above the size" "OMPI_COMM_WORLD_LOCAL_SIZE=3" "${OMPI[@]}" OMPI_COMM_WORLD_LOCAL_SIZE=3
launcher_row mpi "PMI_SIZE=abc (MPICH)" "PMI_SIZE='abc'" PMI_RANK=1 PMI_SIZE=abc
launcher_row mpi "HOROVOD_RANK beyond HOROVOD_SIZE" "HOROVOD_RANK=3" HOROVOD_RANK=3 HOROVOD_SIZE=2 HOROVOD_LOCAL_RANK=0 \
  HOROVOD_LOCAL_SIZE=1
launcher_row mpi "HOROVOD_RANK without HOROVOD_SIZE" "HOROVOD_SIZE" HOROVOD_RANK=0

echo "# store traffic"
# Rank 0 of a 2-rank job is started by hand; a stranger sends PAYLOAD (printf format) to its
# store and hangs up; the store must log one line naming the peer and NEEDLE, and rank 1
# must still join and the all_reduce come out right.
store_row() {
  local what=$1 payload=$2 needle=$3
  ROW=$((ROW + 1))
  local port pid0 i start ms why="" err0
  start=$(now_ms)
  for i in 1 2 3; do
    port=$((10000 + RANDOM % 10000))
    clean_env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port IDIST_JOB_TOKEN=row$ROW IDIST_TIMEOUT=15 \
      "$EX/all_reduce" >"$TMP/r0.out" 2>"$TMP/r0.err" &
    pid0=$!
    until (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; do
      kill -0 $pid0 2>/dev/null || break
      sleep 0.02
    done
    kill -0 $pid0 2>/dev/null && break  # else the port was taken: try another
  done
  # The store may hang up first: a write into the closed socket must not kill this script.
  (trap '' PIPE; exec 3<>/dev/tcp/127.0.0.1/$port; printf "$payload" >&3; sleep 0.2) 2>/dev/null
  wait_for_lines "$TMP/r0.err" "$needle" 1 || why+=" the store logged no line with '$needle';"
  clean_env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port IDIST_JOB_TOKEN=row$ROW IDIST_TIMEOUT=15 \
    "$EX/all_reduce" >"$TMP/r1.out" 2>&1 || why+=" rank 1 failed: $(tail -1 "$TMP/r1.out");"
  wait $pid0 || why+=" rank 0 failed;"
  ms=$(($(now_ms) - start))
  err0=$(cat "$TMP/r0.err")
  [ "$(wc -l <<<"$err0")" = 1 ] || why+=" the store logged $(wc -l <<<"$err0") lines;"
  contains "$err0" "127.0.0.1:" || why+=" the log does not name the peer;"
  contains "$(cat "$TMP/r0.out" "$TMP/r1.out")" "After performing all_reduce: [4, 6]" || why+=" wrong result;"
  verdict "$ms" "$why" "[store] $what -> job completed in ${ms} ms; logged: ${err0#*] }" \
    "[store] $what:{why} log was: $(tr '\n' '|' <<<"$err0")"
}
store_row "an HTTP request instead of a hello" 'GET / HTTP/1.0\r\n\r\n' "dropped client"
store_row "a 2 GiB length prefix" '\xff\xff\xff\x7f' "dropped client"
store_row "a hello with the wrong token" '\x0a\x00\x00\x00\x01\x05\x00\x00\x00wrong' "wrong or missing IDIST_JOB_TOKEN"
store_row "a request before the hello" '\x06\x00\x00\x00\x03\x01\x00\x00\x00k' "no hello"
store_row "a client that hangs up mid-message" '\x64\x00\x00\x00\x01abc' "closed in the middle of a message (4 of 100 bytes)"

# A rank with another job's token (two jobs on one port) is refused and says so; rank 0
# names the rank that never joined. Both are one line, both exit non-zero within the timeout.
ROW=$((ROW + 1))
port=$((10000 + RANDOM % 10000))
start=$(now_ms)
clean_env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port IDIST_JOB_TOKEN=right IDIST_TIMEOUT=2 \
  "$EX/all_reduce" >/dev/null 2>"$TMP/r0.err" &
pid0=$!
err1=$(clean_env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port IDIST_JOB_TOKEN=wrong IDIST_TIMEOUT=2 \
  "$EX/all_reduce" 2>&1 >/dev/null)
rc1=$?
wait $pid0
rc0=$?
ms=$(($(now_ms) - start))
err0=$(grep -v "idist store:" "$TMP/r0.err")
check "[store] a rank with the wrong IDIST_JOB_TOKEN -> exit $rc1 in ${ms} ms: $err1" \
  eval '[ $rc1 = 1 ] && [ "$(wc -l <<<"$err1")" = 1 ] && contains "$err1" "wrong IDIST_JOB_TOKEN" && [ $ms -lt 5000 ]'
check "[store] ... and rank 0 -> exit $rc0: $err0" \
  eval '[ $rc0 = 1 ] && [ "$(wc -l <<<"$err0")" = 1 ] && contains "$err0" "missing rank 1"'
check "[store] ... nothing left behind" no_env_leftovers "IDIST_BAD_INPUT_ROW=$MARKER.$ROW"

# Programs that exist but cannot be executed: a shell's 126, and why in words.
printf '#!/nonexistent/interp\necho hi\n' >"$TMP/badinterp.sh"
printf 'echo hi\n' >"$TMP/noshebang.sh"
chmod +x "$TMP/badinterp.sh" "$TMP/noshebang.sh"
out=$("$RUN" -n 1 "$TMP/badinterp.sh" 2>&1)
rc=$?
check "[exec] a script whose #! interpreter is missing: exit $rc (126), naming the interpreter" eval \
  '[ $rc = 126 ] && contains "$out" "its interpreter /nonexistent/interp (the #! line) does not exist"' || echo "$out"
out=$("$RUN" -n 1 "$TMP/noshebang.sh" 2>&1)
rc=$?
check "[exec] a script without #!: exit $rc (126), saying so" eval \
  '[ $rc = 126 ] && contains "$out" "nor a script with a #! line"' || echo "$out"

echo "# $ROW rows"
finish
