#!/bin/bash
# idist-run under a real SLURM (slurmctld + slurmd started here, see scripts/slurm-local.sh):
# srun with one task per rank (exec in place) and one task per node (spawn), sbatch job
# scripts, block and cyclic distributions, one node and two emulated nodes; the SLURM
# variables of spawned ranks against a real srun's and ignite's rule; two clusters at once
# (as two runs of this test on one machine) and concurrent jobs that must never meet.
# usage: slurm.sh IDIST_RUN EXAMPLES_DIR JOB_SUM      exits 77 (skipped) without SLURM's daemons or root
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
EX=$(realpath "$2")
JOB_SUM=$(realpath "$3")
HERE=$(cd "$(dirname "$0")" && pwd)
RANKS=$HERE/ranks
CLUSTER=$HERE/../../scripts/slurm-local.sh

if [ "$(id -u)" -ne 0 ] || ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null; then
  echo "SKIP: needs root and slurmctld/slurmd (scripts/setup.sh installs them)"
  exit 77
fi

DIR=$(mktemp -d /tmp/idist-slurm.XXXXXX)
cleanup() {
  local c
  for c in "$DIR"/cluster "$DIR"/cluster-a "$DIR"/cluster-b; do bash "$CLUSTER" stop "$c" >/dev/null 2>&1; done
  rm -rf "$DIR"
}
trap cleanup EXIT
cd "$DIR"

# start_cluster NODES [DIR]: a cluster of our own (scripts/slurm-local.sh), SLURM_CONF exported.
start_cluster() {
  local where=${2:-$DIR/cluster} line
  bash "$CLUSTER" stop "$where" >/dev/null 2>&1
  if ! line=$(bash "$CLUSTER" start "$where" --nodes "$1"); then
    echo "not ok - local SLURM with $1 node(s) did not start"
    tail -20 "$where"/*.log
    exit 1
  fi
  eval "$line"
  echo "# SLURM up with $1 node(s): $(sinfo -h -o '%N %T')"
}

# cluster_var DIR NAME: what slurm-local.sh chose for the cluster in DIR (CLUSTER, NODES, PORTS).
cluster_var() { (source "$1/cluster.env" && eval "echo \"\$$2\""); }

# --immediate: never queue forever if the cluster is short of CPUs; timeout: never hang ctest.
SRUN=(timeout 60 srun --immediate=10)

# all_reduce on N ranks: every rank holds [1,2]+2r, the SUM is [N^2, N^2+N].
expect_all_reduce() {
  local what=$1 out=$2 n=$3 r
  local want="[$((n * n)), $((n * n + n))]"
  for r in $(seq 0 $((n - 1))); do
    check "$what: rank $r gets $want" contains "$out" "Rank $r, After performing all_reduce: $want"
  done
}

# field LINE NAME: the value of NAME=... in one print_env.sh line.
field() { grep -o "\b$2=[^ ]*" <<<"$1" | head -1 | cut -d= -f2; }
line_of_rank() { grep "^RANK=$2 " <<<"$1"; }

# ---------------------------------------------------------------- one node
start_cluster 1

out=$("${SRUN[@]}" -n 4 "$RUN" "$EX/all_reduce" 2>&1)
check "srun -n 4 idist-run all_reduce exits 0" equals $? 0
expect_all_reduce "srun -n 4" "$out" 4

# A torch.distributed script (env://, gloo) through idist-run, unchanged, one task per rank.
if /usr/bin/python3 -c "import torch.distributed" 2>/dev/null; then
  out=$("${SRUN[@]}" -n 2 "$RUN" /usr/bin/python3 "$HERE/python/torch_all_reduce.py" 2>&1)
  check "srun -n 2 idist-run python3 torch_all_reduce.py: both ranks right" equals "$(count "$out" " right")" 2 ||
    echo "$out" | tail -5
else
  echo "# SKIP: srun with a PyTorch script: /usr/bin/python3 cannot import torch.distributed"
fi

out=$("${SRUN[@]}" -n 2 "$RUN" "$RANKS/print_env.sh" 2>&1)
check "srun -n 2: two ranks" equals "$(count "$out" "RANK=")" 2
r0=$(line_of_rank "$out" 0)
r1=$(line_of_rank "$out" 1)
check "srun -n 2: IDIST_LAUNCHER=slurm" equals "$(field "$r1" IDIST_LAUNCHER)" slurm
check "srun -n 2: WORLD_SIZE=2" equals "$(field "$r1" WORLD_SIZE)" 2
check "srun -n 2: MASTER_ADDR is the step's first node" equals "$(field "$r1" MASTER_ADDR)" localhost
check "srun -n 2: both tasks derive the same MASTER_PORT" equals "$(field "$r0" MASTER_PORT)" "$(field "$r1" MASTER_PORT)"
check "srun -n 2: port in the default range" test "$(field "$r0" MASTER_PORT)" -ge 20000 -a "$(field "$r0" MASTER_PORT)" -le 32767
check "srun -n 2: exec in place (the program's parent is slurmstepd)" equals "$(field "$r0" PARENT)" slurmstepd

"${SRUN[@]}" -n 2 "$RUN" bash -c 'exit 3' >/dev/null 2>&1
check "srun sees the program's own exit code (3)" equals $? 3

out=$("${SRUN[@]}" -n 2 "$RUN" -n 2 "$EX/all_reduce" 2>&1)
rc=$?
check "doubled launch (2 tasks on a node, each -n 2) is refused" test $rc -ne 0
check "the refusal explains and names --force-spawn" contains "$out" "--force-spawn"

out=$("${SRUN[@]}" -n 1 "$RUN" -n 3 "$EX/all_reduce" 2>&1)
check "srun -n 1 idist-run -n 3 (spawn under a one-task step) exits 0" equals $? 0
expect_all_reduce "srun -n 1 idist-run -n 3" "$out" 3

# idist::spawn and idist::Parallel under srun without idist-run: the program reads the step
# itself and starts no ranks of its own where srun started them (tests/e2e/spawn.sh: the rest).
SPAWN_CHECK=$(dirname "$JOB_SUM")/spawn_check
out=$("${SRUN[@]}" -n 3 "$EX/all_reduce_spawn" 2>&1)
check "srun -n 3 all_reduce_spawn exits 0" equals $? 0
expect_all_reduce "srun -n 3 all_reduce_spawn" "$out" 3
check "srun -n 3 all_reduce_spawn: 3 ranks, no second spawn" equals "$(count "$out" "After performing")" 3
out=$("${SRUN[@]}" -n 1 "$EX/all_reduce_spawn" 2>&1)
expect_all_reduce "srun -n 1 all_reduce_spawn (the task starts 3)" "$out" 3
out=$("${SRUN[@]}" -n 3 "$SPAWN_CHECK" parallel 2>&1)
check "srun -n 3 Parallel: fn in each task's own process" equals "$(count "$out" "caller's process: yes")" 3
check "srun -n 3 Parallel: collectives right over 3" equals "$(count "$out" "/3: collectives ok")" 3 ||
  echo "$out" | tail -5

out=$("${SRUN[@]}" -n 2 --export=ALL,RANK=5,WORLD_SIZE=2 "$RUN" "$EX/all_reduce" 2>&1)
check "RANK=5 disagreeing with SLURM_PROCID is refused" contains "$out" "disagree"
check "the refusal names SLURM_PROCID and RANK" contains "$out" "(SLURM step) and RANK=5"

# The batch script is not a step: outside srun it must not claim to be rank 0 of N.
cat >job.sh <<EOF
#!/bin/bash
#SBATCH --ntasks=4
"$RUN" --dry-run "$EX/all_reduce" > batch_plan.json
srun "$RUN" "$EX/all_reduce"
EOF
timeout 60 sbatch --wait -o job.out job.sh >/dev/null
check "sbatch job exits 0" equals $? 0
expect_all_reduce "sbatch (ntasks=4), srun inside" "$(cat job.out)" 4
check "the batch script plans launcher spawn" equals "$(jq -r .launcher batch_plan.json)" spawn
check "the batch script plans a world of 1, not 4" equals "$(jq -r .world_size batch_plan.json)" 1
check "the plan says why SLURM was not used" contains "$(jq -r '.notes[]' batch_plan.json)" "SLURM_STEP_ID is not"

# Two steps of one job at once: different ports, both run.
cat >steps.sh <<EOF
#!/bin/bash
#SBATCH --ntasks=4
srun --exact -n 2 "$RUN" "$EX/all_reduce" > step_a.out 2>&1 &
srun --exact -n 2 "$RUN" "$EX/all_reduce" > step_b.out 2>&1 &
srun --exact -n 1 "$RUN" --dry-run "$EX/all_reduce" > step_c.json
srun --exact -n 1 "$RUN" --dry-run "$EX/all_reduce" > step_d.json
wait
EOF
timeout 60 sbatch --wait -o steps.out steps.sh >/dev/null
check "two concurrent steps of one job: first all_reduce right" contains "$(cat step_a.out)" "Rank 1, After performing all_reduce: [4, 6]"
check "two concurrent steps of one job: second all_reduce right" contains "$(cat step_b.out)" "Rank 1, After performing all_reduce: [4, 6]"
pc=$(jq -r .master_port step_c.json)
pd=$(jq -r .master_port step_d.json)
check "two steps of one job derive different ports ($pc, $pd)" test "$pc" != "$pd" -a -n "$pc"

# ---------------------------------------------------------------- two emulated nodes
start_cluster 2

out=$("${SRUN[@]}" -N2 -n4 "$RUN" "$EX/all_reduce" 2>&1)
check "srun -N2 -n4 exits 0" equals $? 0
expect_all_reduce "srun -N2 -n4" "$out" 4

out=$("${SRUN[@]}" -N2 --ntasks-per-node=2 "$RUN" "$RANKS/print_env.sh" 2>&1)
for r in 0 1 2 3; do
  check "srun -N2 --ntasks-per-node=2 (block): rank $r on node $((r / 2))" equals "$(field "$(line_of_rank "$out" $r)" NODE_RANK)" $((r / 2))
done
first_node=$(cluster_var "$DIR/cluster" NODES | cut -d' ' -f1)
check "srun -N2 -n4: MASTER_ADDR is the first node ($first_node)" equals "$(field "$(line_of_rank "$out" 3)" MASTER_ADDR)" "$first_node"
check "srun -N2 -n4: GROUP_WORLD_SIZE=2" equals "$(field "$(line_of_rank "$out" 3)" GROUP_WORLD_SIZE)" 2

out=$("${SRUN[@]}" -N2 --ntasks-per-node=2 --distribution=cyclic "$RUN" "$RANKS/print_env.sh" 2>&1)
for r in 0 1 2 3; do
  check "srun -N2 --ntasks-per-node=2 --distribution=cyclic: rank $r on node $((r % 2))" equals "$(field "$(line_of_rank "$out" $r)" NODE_RANK)" $((r % 2))
done
out=$("${SRUN[@]}" -N2 --ntasks-per-node=2 --distribution=cyclic "$RUN" "$EX/all_reduce" 2>&1)
expect_all_reduce "srun -N2 -n4 --distribution=cyclic" "$out" 4

out=$("${SRUN[@]}" -N2 -n3 "$RUN" "$RANKS/print_env.sh" 2>&1)
check "uneven srun -N2 -n3: node 0 holds 2 ranks" equals "$(field "$(line_of_rank "$out" 0)" LOCAL_WORLD_SIZE)" 2
check "uneven srun -N2 -n3: node 1 holds 1 rank" equals "$(field "$(line_of_rank "$out" 2)" LOCAL_WORLD_SIZE)" 1

for dist in block cyclic; do
  out=$("${SRUN[@]}" -N2 --ntasks-per-node=1 --distribution=$dist "$RUN" -n 2 "$EX/all_reduce" 2>&1)
  check "srun -N2 --ntasks-per-node=1 --distribution=$dist idist-run -n 2 exits 0" equals $? 0
  expect_all_reduce "one task per node ($dist), -n 2 each" "$out" 4
  out=$("${SRUN[@]}" -N2 --ntasks-per-node=1 --distribution=$dist "$RUN" -n 2 "$RANKS/print_env.sh" 2>&1)
  for r in 0 1 2 3; do
    line=$(line_of_rank "$out" $r)
    check "one task per node ($dist): rank $r is local rank $((r % 2)) of node $((r / 2))" \
      equals "$(field "$line" NODE_RANK)/$(field "$line" LOCAL_RANK)/$(field "$line" LOCAL_WORLD_SIZE)" "$((r / 2))/$((r % 2))/2"
  done
  check "one task per node ($dist): ranks are spawned by idist-run" equals "$(field "$(line_of_rank "$out" 3)" PARENT)" idist-run
done

# ---------------------------------------------------------------- spawned ranks' SLURM variables
# srun -N2 --ntasks-per-node=1 idist-run -n 2: each rank gets what srun -N2 --ntasks-per-node=2
# would have given it as a task, so ignite.distributed and Lightning, which compare SLURM_PROCID,
# SLURM_LOCALID and SLURM_NTASKS with RANK, LOCAL_RANK and WORLD_SIZE, accept it.
rm -rf envs && mkdir envs
"${SRUN[@]}" -N2 --ntasks-per-node=1 "$RUN" -n 2 bash -c 'env | grep "^SLURM" | sort >"$0.$RANK"' "$DIR/envs/idist" 2>&1
check "srun -N2 --ntasks-per-node=1 idist-run -n 2 env: exits 0" equals $? 0
"${SRUN[@]}" -N2 --ntasks-per-node=2 bash -c 'env | grep "^SLURM" | sort >"$0.$SLURM_PROCID"' "$DIR/envs/srun" 2>&1
# The contract, in closed form: rank r is local rank r%2 on node r/2 of 2 nodes x 2 ranks.
slurm_var() { grep "^$2=" "envs/idist.$1" | cut -d= -f2-; }
for r in 0 1 2 3; do
  got=""
  for v in SLURM_PROCID SLURM_LOCALID SLURM_NODEID SLURM_NTASKS SLURM_NPROCS SLURM_STEP_NUM_TASKS \
    SLURM_TASKS_PER_NODE SLURM_STEP_TASKS_PER_NODE SLURM_NTASKS_PER_NODE SLURM_GTIDS; do
    got+="$v=$(slurm_var $r $v) "
  done
  node=$((r / 2))
  want="SLURM_PROCID=$r SLURM_LOCALID=$((r % 2)) SLURM_NODEID=$node SLURM_NTASKS=4 SLURM_NPROCS=4 SLURM_STEP_NUM_TASKS=4 "
  want+="SLURM_TASKS_PER_NODE=2(x2) SLURM_STEP_TASKS_PER_NODE=2(x2) SLURM_NTASKS_PER_NODE=2 SLURM_GTIDS=$((2 * node)),$((2 * node + 1)) "
  check "spawned rank $r: SLURM variables as a task of its own" equals "$got" "$want" || echo "  got:  $got"
  # What differs from srun's own task r: the job, srun's ports, the task's pid (idist-run) and
  # the CPUs (the ranks share their task's allocation); nothing else.
  differ=$(diff <(grep -vE '^SLURM_(JOB_?ID|JOB_NAME|SRUN_COMM_PORT|STEP_LAUNCHER_PORT|TASK_PID|CPUS_ON_NODE|JOB_CPUS_PER_NODE)=' "envs/idist.$r") \
    <(grep -vE '^SLURM_(JOB_?ID|JOB_NAME|SRUN_COMM_PORT|STEP_LAUNCHER_PORT|TASK_PID|CPUS_ON_NODE|JOB_CPUS_PER_NODE)=' "envs/srun.$r"))
  check "spawned rank $r: every other SLURM variable equals real srun's task $r" equals "$differ" "" ||
    echo "$differ" | head -10 | sed 's/^/  /'
done

RULE=$HERE/python/ignite_slurm_rule.py
out=$("${SRUN[@]}" -N2 --ntasks-per-node=1 "$RUN" -n 2 /usr/bin/python3 "$RULE" 2>&1)
check "spawned ranks pass ignite's SLURM rule (exit 0)" equals $? 0
check "spawned ranks pass ignite's SLURM rule (4 ranks ok)" equals "$(count "$out" "SLURM rule: ok")" 4 || echo "$out" | head -5
out=$("${SRUN[@]}" -N2 --ntasks-per-node=1 "$RUN" --keep-slurm-env -n 2 /usr/bin/python3 "$RULE" 2>&1)
check "--keep-slurm-env: the task's variables, which ignite refuses" contains "$out" "inconsistent with equivalent SLURM env variable"
out=$("${SRUN[@]}" -N2 --ntasks-per-node=1 --export=ALL,IDIST_KEEP_SLURM_ENV=1 "$RUN" -n 2 bash -c 'echo "RANK=$RANK SLURM_PROCID=$SLURM_PROCID"' 2>&1)
check "IDIST_KEEP_SLURM_ENV=1 keeps them too (rank 1 sees its task's SLURM_PROCID=0)" contains "$out" "RANK=1 SLURM_PROCID=0"
out=$("${SRUN[@]}" -N2 -n4 "$RUN" /usr/bin/python3 "$RULE" 2>&1)
check "one task per rank (exec in place): srun's variables, which ignite accepts" equals "$(count "$out" "SLURM rule: ok")" 4
# The real ignite, where this machine has it (not in CI): the same job, ignite's own check.
if /usr/bin/python3 -c "import ignite.distributed" 2>/dev/null; then
  out=$("${SRUN[@]}" -N2 --ntasks-per-node=1 "$RUN" -n 2 /usr/bin/python3 -c '
import ignite.distributed as idist, torch
def fn(_):
    s = idist.all_reduce(torch.tensor([idist.get_rank() + 1]))
    print(f"ignite rank {idist.get_rank()}/{idist.get_world_size()} sum {s.item()}", flush=True)
with idist.Parallel(backend="gloo") as p:
    p.run(fn)' 2>&1)
  check "real ignite.distributed.Parallel under srun -N2 idist-run -n 2: 4 ranks sum 10" equals "$(count "$out" "/4 sum 10")" 4 ||
    echo "$out" | tail -5
else
  echo "# SKIP: the real ignite.distributed: not importable here (tests/e2e/python/ignite_slurm_rule.py mirrors its rule)"
fi

cat >job2.sh <<EOF
#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=2
"$RUN" --dry-run "$EX/all_reduce" > batch_plan2.json
srun "$RUN" "$EX/all_reduce"
EOF
timeout 60 sbatch --wait -o job2.out job2.sh >/dev/null
check "sbatch --nodes=2 --ntasks-per-node=2 exits 0" equals $? 0
expect_all_reduce "sbatch 2 nodes x 2 tasks" "$(cat job2.out)" 4
check "the two-node batch script does not claim rank 0 of 4" equals "$(jq -r '.world_size' batch_plan2.json)" 1

# The job scripts of scripts/examples/, as a user submits them: idist-run from PATH.
JOBS=$(cd "$HERE/../../scripts/examples" && pwd)
for script in sbatch_task_per_rank sbatch_task_per_node; do
  PATH="$(dirname "$RUN"):$PATH" PROGRAM="$EX/all_reduce" timeout 60 sbatch --wait -o "$script.out" \
    "$JOBS/$script.sh" >/dev/null
  check "sbatch scripts/examples/$script.sh exits 0" equals $? 0
  expect_all_reduce "scripts/examples/$script.sh" "$(cat "$script.out")" 4
done

# ---------------------------------------------------------------- two clusters, concurrent jobs
# Two clusters at once, as two runs of this test on one machine: started together, each must
# come up on its own ports and run its jobs on its own nodes, and stopping one must leave the
# other (daemons, munged, /etc/hosts line) working.
bash "$CLUSTER" stop "$DIR/cluster" >/dev/null 2>&1
A=$DIR/cluster-a
B=$DIR/cluster-b
bash "$CLUSTER" start "$A" --nodes 2 >a.start 2>&1 &
pid_a=$!
bash "$CLUSTER" start "$B" --nodes 2 >b.start 2>&1 &
pid_b=$!
wait $pid_a; rc_a=$?
wait $pid_b; rc_b=$?
check "two clusters started at once both come up" equals "$rc_a/$rc_b" 0/0 || { cat a.start b.start; finish; exit 1; }
name_a=$(cluster_var "$A" CLUSTER)
name_b=$(cluster_var "$B" CLUSTER)
check "they have different names ($name_a, $name_b)" test "$name_a" != "$name_b"
check "they share no port ($(cluster_var "$A" PORTS) / $(cluster_var "$B" PORTS))" equals \
  "$(printf '%s\n' $(cluster_var "$A" PORTS) $(cluster_var "$B" PORTS) | sort | uniq -d)" ""
for c in A B; do
  conf=${!c}/slurm.conf
  name=$(cluster_var "${!c}" CLUSTER)
  out=$(SLURM_CONF=$conf "${SRUN[@]}" -N2 --ntasks-per-node=1 bash -c 'echo "$SLURM_CLUSTER_NAME $SLURMD_NODENAME"' 2>&1 | sort)
  check "cluster $c: srun runs on its own nodes" equals "$out" "$name ${name}n1"$'\n'"$name ${name}n2"
  check "cluster $c: its controller is its own" equals \
    "$(SLURM_CONF=$conf scontrol show config | sed -n 's/^ClusterName *= *//p')" "$name"
done

# Concurrent jobs with inputs of their own (lib.sh's two_jobs: values 1000 and 7, 3 ranks each,
# every sum checked): one on each cluster, spawned and exec'd in place, and two in one cluster.
# Jobs that met (one rendezvous) would mix their sums or fail.
on_cluster_of_value() {  # SRUN_ARGS... VALUE: job 1000 runs on cluster A, job 7 on cluster B
  local conf=$B/slurm.conf
  [ "${*: -1}" = 1000 ] && conf=$A/slurm.conf
  SLURM_CONF=$conf "${SRUN[@]}" "$@"
}
two_jobs "one job per cluster, spawned (srun -n1 idist-run -n 3)" on_cluster_of_value -N1 -n1 "$RUN" -n 3 "$JOB_SUM" 40 25
two_jobs "one job per cluster, in place (srun -N2 -n3 idist-run)" on_cluster_of_value -N2 -n3 "$RUN" "$JOB_SUM" 40 25
two_jobs "two jobs in cluster A (srun -N2 -n3 idist-run)" env SLURM_CONF="$A/slurm.conf" "${SRUN[@]}" -N2 -n3 "$RUN" "$JOB_SUM" 40 25
if /usr/bin/python3 -c "import torch.distributed" 2>/dev/null; then
  two_jobs "one job per cluster, torch.distributed env://" on_cluster_of_value -N2 -n3 "$RUN" /usr/bin/python3 \
    "$HERE/python/torch_job_sum.py" 20
else
  echo "# SKIP: concurrent torch jobs: /usr/bin/python3 cannot import torch.distributed"
fi

bash "$CLUSTER" stop "$A"
check "stopping cluster A takes its /etc/hosts line out" equals "$(grep -c "cluster $name_a\$" /etc/hosts)" 0
check "... and leaves cluster B's" equals "$(grep -c "cluster $name_b\$" /etc/hosts)" 1
check "... whose node names still resolve" equals "$(getent hosts "${name_b}n2" | awk '{print $1}')" 127.0.0.1
check "cluster A's daemons are gone" equals "$(SLURM_CONF=$A/slurm.conf timeout 20 sinfo -h -o %T 2>/dev/null)" ""
check "cluster B's nodes are still idle" equals "$(SLURM_CONF=$B/slurm.conf sinfo -h -N -o %T | sort -u)" idle
out=$(SLURM_CONF=$B/slurm.conf "${SRUN[@]}" -N2 --ntasks-per-node=1 "$RUN" -n 2 "$EX/all_reduce" 2>&1)
expect_all_reduce "cluster B after A stopped" "$out" 4
bash "$CLUSTER" stop "$B"
check "stopping cluster B takes its line out too" equals "$(grep -c "cluster $name_b\$" /etc/hosts)" 0

finish
