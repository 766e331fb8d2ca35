#!/bin/bash
# idist-run under a real SLURM (slurmctld + slurmd started here, see scripts/slurm-local.sh):
# srun with one task per rank (exec in place) and one task per node (spawn), sbatch job
# scripts, block and cyclic distributions, one node and two emulated nodes.
# usage: slurm.sh IDIST_RUN EXAMPLES_DIR      exits 77 (skipped) without SLURM's daemons or root
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
EX=$(realpath "$2")
HERE=$(cd "$(dirname "$0")" && pwd)
RANKS=$HERE/ranks
CLUSTER=$HERE/../../scripts/slurm-local.sh

if [ "$(id -u)" -ne 0 ] || ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null; then
  echo "SKIP: needs root and slurmctld/slurmd (scripts/setup.sh installs them)"
  exit 77
fi

DIR=$(mktemp -d /tmp/idist-slurm.XXXXXX)
cleanup() { bash "$CLUSTER" stop "$DIR/cluster" >/dev/null 2>&1; rm -rf "$DIR"; }
trap cleanup EXIT
cd "$DIR"

start_cluster() {
  bash "$CLUSTER" stop "$DIR/cluster" >/dev/null 2>&1
  local line
  if ! line=$(bash "$CLUSTER" start "$DIR/cluster" --nodes "$1"); then
    echo "not ok - local SLURM with $1 node(s) did not start"
    tail -20 "$DIR"/cluster/*.log
    exit 1
  fi
  eval "$line"
  echo "# SLURM up with $1 node(s): $(sinfo -h -o '%N %T')"
}

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
check "srun -N2 -n4: MASTER_ADDR=node1" equals "$(field "$(line_of_rank "$out" 3)" MASTER_ADDR)" node1
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

finish
