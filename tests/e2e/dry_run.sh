#!/bin/bash
# --dry-run over recorded launcher environments (as srun, mpirun, horovodrun and torchrun set
# them): the JSON plan idist-run prints, and the one-line errors for conflicting or malformed
# sets. `env -i` keeps this machine's own variables out.
# usage: dry_run.sh IDIST_RUN EXAMPLES_DIR
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")

# Claims of cpus (other idist-run jobs' bound ranks) in a directory of this test's own: jobs of
# tests running beside it do not change what the plans here bind.
CLAIMS=$(mktemp -d)
trap 'rm -rf "$CLAIMS"' EXIT
plan() { env -i PATH="$PATH" IDIST_CPU_CLAIMS="$CLAIMS" "$@"; }
q() { jq -r "$1" <<<"$2"; }

# Plain spawn.
out=$(plan "$RUN" --dry-run -n 3 /bin/false)
check "dry run exits 0 and starts nothing (/bin/false would fail)" equals $? 0
check "spawn: launcher" equals "$(q .launcher "$out")" spawn
check "spawn: 3 ranks planned" equals "$(q '.ranks | length' "$out")" 3
check "spawn: rank 2's env has RANK=2" equals "$(q '.ranks[2].env.RANK' "$out")" 2
check "spawn: every documented key is there" equals \
  "$(q '[has("launcher","backend","world_size","nnodes","node_rank","local_world_size","master_addr","master_port","hosts","provenance","ranks")] | all' "$out")" true
check "spawn: provenance covers rank, world_size, local_rank, node_rank, master_addr, master_port" equals \
  "$(q '.provenance | [has("rank","world_size","local_rank","node_rank","master_addr","master_port")] | all' "$out")" true
check "spawn: the job token is not printed" equals "$(q '.ranks[0].env.IDIST_JOB_TOKEN' "$out")" "<hidden>"
check "spawn: hosts is this host" equals "$(q '.hosts[0]' "$out")" "$(hostname)"
check "spawn: --backend shows" equals "$(q .backend "$(plan "$RUN" --dry-run --backend gloo /bin/true)")" gloo
# Between hosts: the setting and where it came from (the ranks choose at init).
out=$(plan "$RUN" --dry-run -n 2 /bin/true)
check "interhost: auto by default, unused on one host" equals "$(q '[.interhost.setting, .interhost.from, .interhost.used] | join(" / ")' "$out")" \
  "auto / default / no (one host)"
out=$(plan IDIST_INTERHOST=gloo "$RUN" --dry-run --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --rdzv-id dry -n 2 /bin/true)
check "interhost: IDIST_INTERHOST=gloo shows, for a job of 2 hosts" equals \
  "$(q '[.interhost.setting, .interhost.from, (.interhost.used | startswith("between hosts"))] | join(" / ")' "$out")" \
  "gloo / IDIST_INTERHOST / true"
# What the setting comes to as far as this host can tell: the ucx plugin beside this build's
# libidist loads (setup.sh builds it); an idist-run with no plugin where it looks says gloo;
# one host needs no carrier between hosts.
two_hosts=(--dry-run --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --rdzv-id dry -n 2 /bin/true)
# The build tree's layout (apps/idist-run/idist-run, lib/idist/): the plugin where a build with
# ucx writes it.
if [ -f "$(dirname "$RUN")/../../lib/idist/libidist-backend-ucx.so" ]; then
  check "interhost: auto, the plugin loads here: ucx where every host can" test -n \
    "$(q .interhost.choice "$(plan "$RUN" "${two_hosts[@]}")" | grep '^ucx where every host.*libidist-backend-ucx.so')"
else
  echo "# skipped: this build has no usable ucx plugin, so auto's ucx answer is not checked"
fi
check "interhost: one host: not used" equals "$(q .interhost.choice "$(plan IDIST_INTERHOST=ucx "$RUN" --dry-run -n 2 /bin/true)")" \
  "not used (one host)"
check "interhost: gloo is certain" equals "$(q .interhost.choice "$(plan IDIST_INTERHOST=gloo "$RUN" "${two_hosts[@]}")")" gloo
check "interhost: a value that is none of them is shown as refused" test -n \
  "$(q .interhost.choice "$(plan IDIST_INTERHOST=rdma "$RUN" "${two_hosts[@]}")" | grep "^none: IDIST_INTERHOST='rdma' is not auto, ucx or gloo")"
# idist-run looks where its libidist does: a copy of libidist with an empty idist/ beside it.
lonely=$(mktemp -d)
mkdir "$lonely/idist"
cp -P "$(dirname "$(ldd "$RUN" | awk '/libidist\.so/ {print $3}')")"/libidist.so* "$lonely/"
check "interhost: no plugin where it looks: gloo, saying why" test -n \
  "$(q .interhost.choice "$(plan LD_LIBRARY_PATH="$lonely" "$RUN" "${two_hosts[@]}")" |
    grep "^gloo: this host cannot run ucx (backend 'ucx' is not installed: no libidist-backend-ucx.so in $lonely/idist")"
check "interhost: ucx required where it cannot run: every rank would fail, said before they start" test -n \
  "$(q .interhost.choice "$(plan IDIST_INTERHOST=ucx LD_LIBRARY_PATH="$lonely" "$RUN" "${two_hosts[@]}")" | grep '^none: ucx is required but this host cannot run it')"
rm -rf "$lonely"
# Binding: by default where every rank gets a cpu of its own and nobody bound idist-run.
cpus=$(nproc)  # idist-run's mask, as this shell's
online=$(getconf _NPROCESSORS_ONLN)
out=$(plan "$RUN" --dry-run -n 1 /bin/true)
if [ "$cpus" -eq "$online" ]; then
  check "binding: -n 1 on an unnarrowed mask: bound by default ($(q .binding.why "$out"))" \
    equals "$(q .binding.bound "$out")" true
  out=$(plan "$RUN" --dry-run -n "$cpus" /bin/true)
  check "binding: one rank per cpu: bound, each on its own cpu" \
    equals "$(q '[.binding.bound, (.binding.cpus | length), (.binding.cpus | unique | length)] | join(" ")' "$out")" \
    "true $cpus $cpus"
  check "binding: one cpu in each share" equals "$(q '.binding.cpus[0]' "$out" | tr ',' '\n' | wc -l)" 1
else
  echo "# SKIP: the default binding: this shell's affinity mask ($cpus cpus) is already narrower than the machine ($online)"
fi
out=$(plan "$RUN" --dry-run --no-bind -n 1 /bin/true)
check "binding: --no-bind: not bound" equals "$(q .binding.bound "$out")" false
check "binding: --no-bind: says why" contains "$(q .binding.why "$out")" "not bound: --no-bind"
out=$(plan IDIST_BIND=0 "$RUN" --dry-run -n 1 /bin/true)
check "binding: IDIST_BIND=0: not bound" equals "$(q .binding.bound "$out")" false
out=$(plan "$RUN" --dry-run -n $((cpus + 1)) /bin/true)
check "binding: more ranks than cpus: not bound by default" equals "$(q .binding.bound "$out")" false
check "binding: ... says why" contains "$(q .binding.why "$out")" "$((cpus + 1)) rank(s) on $cpus usable cpu(s)"
out=$(plan "$RUN" --dry-run --bind -n $((cpus + 1)) /bin/true)
check "binding: --bind with more ranks than cpus: bound, sharing" equals "$(q '.binding.cpus | length' "$out")" $((cpus + 1))
if [ "$online" -ge 2 ] && command -v taskset >/dev/null; then
  out=$(plan taskset -c 0 "$RUN" --dry-run -n 1 /bin/true)
  check "binding: under taskset -c 0: not bound (someone bound idist-run)" equals "$(q .binding.bound "$out")" false
  check "binding: ... says why" contains "$(q .binding.why "$out")" "affinity mask (0) is narrower"
  out=$(plan taskset -c 0 "$RUN" --dry-run --bind -n 2 /bin/true)
  check "binding: --bind under taskset -c 0: both ranks on cpu 0" equals "$(q '.binding.cpus | join(" ")' "$out")" "0 0"
else
  echo "# SKIP: binding under taskset: needs taskset and 2 cpus"
fi
# Two jobs at once: the second leaves out the cpus the first bound its ranks to (a job holds an
# flock on CLAIMS/cpuN for each while it runs, as a sleep does here for the first cpu), and stays
# unbound where too few are left.
if [ "$cpus" -eq "$online" ] && [ "$cpus" -ge 2 ] && command -v flock >/dev/null; then
  first=$(cut -d, -f1 <<<"$(grep Cpus_allowed_list /proc/self/status | cut -f2)" | cut -d- -f1)
  : >"$CLAIMS/cpu$first"
  (exec 9<"$CLAIMS/cpu$first" && flock -x 9 && exec sleep 30) &  # the lock dies with the sleep
  holder=$!
  for _ in $(seq 50); do flock -n -s "$CLAIMS/cpu$first" true || break; sleep 0.1; done
  out=$(plan "$RUN" --dry-run -n 1 /bin/true)
  check "two jobs: cpu $first held by another job: bound to the others" \
    equals "$(q '[.binding.bound, (.binding.cpus[0] | split(",") | map(tonumber) | index('"$first"') == null)] | join(" ")' "$out")" "true true"
  check "two jobs: ... says which it left out" contains "$(q .binding.why "$out")" "leaving out those other idist-run jobs here bound ranks to cpu(s) $first"
  out=$(plan "$RUN" --dry-run -n "$cpus" /bin/true)
  check "two jobs: one rank per cpu, one cpu held: not bound" equals "$(q .binding.bound "$out")" false
  check "two jobs: ... says why" contains "$(q .binding.why "$out")" "which leaves fewer than a cpu per rank"
  kill "$holder"
  wait "$holder" 2>/dev/null
  out=$(plan "$RUN" --dry-run -n "$cpus" /bin/true)
  check "two jobs: the first gone, its cpu is free again" equals "$(q .binding.bound "$out")" true
  # A real job's claims: while \`idist-run -n 1 sleep\` runs (its one rank has every cpu), another is not bound.
  plan "$RUN" -n 1 sleep 5 &
  job=$!
  for _ in $(seq 50); do flock -n -s "$CLAIMS/cpu$first" true 2>/dev/null || break; sleep 0.1; done
  out=$(plan "$RUN" --dry-run -n 1 /bin/true)
  check "two jobs: beside a running job bound to every cpu: not bound" equals "$(q .binding.bound "$out")" false
  kill "$job"
  wait "$job" 2>/dev/null
else
  echo "# SKIP: two jobs' binding: needs flock and 2 cpus, and an unnarrowed mask"
fi
check "binding: settings show bind unset when neither --bind nor --no-bind is given" \
  equals "$(q '.settings | has("bind")' "$(plan "$RUN" --dry-run /bin/true)")" false

out=$(plan "$RUN" --dry-run --local-rank-arg -n 2 ./train.py --epochs 3)
check "--local-rank-arg: --local_rank=N between the script and its arguments (as torch.distributed.launch)" \
  equals "$(q '.ranks[1].command | join(" ")' "$out")" "python3 -u ./train.py --local_rank=1 --epochs 3"
# An interpreter named on the command line (the README's form): after the script or module,
# never between python3 and it, where python3 would take it for its own option and exit 2.
PY=$(command -v python3)
out=$(plan "$RUN" --dry-run --local-rank-arg -n 2 "$PY" script.py --epochs 3)
check "--local-rank-arg: python3 script.py: after the script" \
  equals "$(q '.ranks[1].command | join(" ")' "$out")" "$PY script.py --local_rank=1 --epochs 3"
out=$(plan "$RUN" --dry-run --local-rank-arg -n 2 python3 -u script.py --epochs 3)
check "--local-rank-arg: python3 -u script.py: after the script" \
  equals "$(q '.ranks[1].command | join(" ")' "$out")" "python3 -u script.py --local_rank=1 --epochs 3"
out=$(plan "$RUN" --dry-run --local-rank-arg -n 2 python3 -m pkg.train --epochs 3)
check "--local-rank-arg: python3 -m pkg.train: after the module" \
  equals "$(q '.ranks[0].command | join(" ")' "$out")" "python3 -m pkg.train --local_rank=0 --epochs 3"
out=$(plan "$RUN" --dry-run -n 2 python3 train.py)
check "every rank gets PYTHONUNBUFFERED=1 (a rank's stdout is a pipe)" \
  equals "$(q '[.ranks[].env.PYTHONUNBUFFERED] | join(" ")' "$out")" "1 1"
out=$(plan PYTHONUNBUFFERED= "$RUN" --dry-run -n 2 python3 train.py)
check "PYTHONUNBUFFERED the user set (even empty) is theirs" equals "$(q '.ranks[0].env | has("PYTHONUNBUFFERED")' "$out")" false
out=$(plan "$RUN" --dry-run --local-rank-arg -n 2 /bin/echo a -- b)
check "--local-rank-arg: a program's '--' does not swallow it" equals "$(q '.ranks[0].command | join(" ")' "$out")" "/bin/echo --local_rank=0 a -- b"

# A task of `srun -N2 -n3 --distribution=cyclic` (recorded).
SLURM_TASK=(SLURM_JOB_ID=5 SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_LOCALID=0 SLURM_NODEID=1 SLURM_NTASKS=3
  SLURM_STEP_NUM_TASKS=3 SLURM_STEP_NUM_NODES=2 SLURM_STEP_TASKS_PER_NODE=2,1 SLURM_STEP_NODELIST=node[1-2]
  SLURM_NODELIST=node[1-2] SLURM_DISTRIBUTION=cyclic)
out=$(plan "${SLURM_TASK[@]}" "$RUN" --dry-run /bin/true)
check "slurm: launcher" equals "$(q .launcher "$out")" slurm
check "slurm: exec in place, one rank" equals "$(q '.mode + " " + (.ranks | length | tostring)' "$out")" "exec 1"
check "slurm: rank 1 of 3 on node 1 of 2, alone there" equals \
  "$(q '[.ranks[0].rank, .world_size, .node_rank, .nnodes, .local_world_size] | map(tostring) | join(" ")' "$out")" "1 3 1 2 1"
check "slurm: hosts expanded" equals "$(q '.hosts | join(",")' "$out")" "node1,node2"
check "slurm: master is the step's first host" equals "$(q .master_addr "$out")" node1
check "slurm: rank came from SLURM_PROCID" equals "$(q .provenance.rank "$out")" SLURM_PROCID
check "slurm: node_rank came from SLURM_NODEID" equals "$(q .provenance.node_rank "$out")" SLURM_NODEID
port=$(q .master_port "$out")
check "slurm: port $port derived into 20000-32767" test "$port" -ge 20000 -a "$port" -le 32767
port_step1=$(q .master_port "$(plan "${SLURM_TASK[@]/SLURM_STEP_ID=0/SLURM_STEP_ID=1}" "$RUN" --dry-run /bin/true)")
check "slurm: the next step gets another port ($port, $port_step1)" test "$port" != "$port_step1"
out=$(plan "${SLURM_TASK[@]}" "$RUN" --dry-run --port-range 40000-40009 /bin/true)
check "slurm: --port-range bounds the port" test "$(q .master_port "$out")" -ge 40000 -a "$(q .master_port "$out")" -le 40009
out=$(plan "${SLURM_TASK[@]}" IDIST_PORT_RANGE=41000-41000 "$RUN" --dry-run /bin/true)
check "slurm: IDIST_PORT_RANGE works too" equals "$(q .master_port "$out")" 41000
out=$(plan "${SLURM_TASK[@]}" "$RUN" --dry-run --master-addr 10.0.0.9 --master-port 1234 /bin/true)
check "slurm: --master-addr/--master-port override" equals "$(q '.master_addr + ":" + (.master_port|tostring) + " " + .provenance.master_port' "$out")" "10.0.0.9:1234 --master-port"
out=$(plan "${SLURM_TASK[@]}" MASTER_PORT=29999 "$RUN" --dry-run /bin/true)
check "slurm: MASTER_PORT exported to the job is used" equals "$(q .master_port "$out")" 29999
out=$(plan "${SLURM_TASK[@]}" IDIST_NO_DETECT=1 "$RUN" --dry-run /bin/true)
check "IDIST_NO_DETECT=1: spawn" equals "$(q .launcher "$out")" spawn
out=$(plan "${SLURM_TASK[@]}" "$RUN" --dry-run --launcher spawn -n 2 /bin/true)
check "--launcher spawn: spawn, world size from -n" equals "$(q '.launcher + " " + (.world_size|tostring)' "$out")" "spawn 2"
out=$(plan "${SLURM_TASK[@]/SLURM_STEP_TASKS_PER_NODE=2,1/SLURM_STEP_TASKS_PER_NODE=1(x3)}" SLURM_STEP_NUM_NODES=3 \
  SLURM_STEP_NODELIST=node[1-3] "$RUN" --dry-run -n 4 /bin/true)
check "slurm, one task per node, -n 4: ranks 4-7 of 12 on node 1" equals \
  "$(q '[.ranks[].rank] | map(tostring) | join(" ")' "$out") $(q .world_size "$out")" "4 5 6 7 12"

# The sbatch batch script: SLURM variables without SLURM_STEP_ID.
out=$(plan SLURM_JOB_ID=6 SLURM_PROCID=0 SLURM_NTASKS=4 SLURM_NNODES=2 SLURM_NODEID=0 SLURM_LOCALID=0 \
  SLURM_TASKS_PER_NODE='2(x2)' SLURM_NODELIST='node[1-2]' "$RUN" --dry-run /bin/true)
check "batch script: not rank 0 of 4 but a world of 1" equals "$(q '.launcher + " " + (.world_size|tostring)' "$out")" "spawn 1"

# mpirun -np 2, rank 1 (recorded, Open MPI 4.1).
OMPI=(OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=1 OMPI_COMM_WORLD_LOCAL_SIZE=2
  OMPI_COMM_WORLD_NODE_RANK=1 OMPI_MCA_ess_base_jobid=146997249 OMPI_MCA_orte_num_nodes=1 PMIX_RANK=1
  PMIX_NAMESPACE=146997249)
out=$(plan "${OMPI[@]}" "$RUN" --dry-run /bin/true)
check "open mpi: launcher mpi, detected by Open MPI" equals "$(q '.launcher + "/" + .detected_by' "$out")" "mpi/Open MPI"
check "open mpi: one node, so 127.0.0.1" equals "$(q .master_addr "$out")" 127.0.0.1
check "open mpi: port derived from the job id" contains "$(q .provenance.master_port "$out")" OMPI_MCA_ess_base_jobid

# horovodrun (gloo mode), 2 hosts x 2 slots, rank 3.
HVD=(HOROVOD_RANK=3 HOROVOD_SIZE=4 HOROVOD_LOCAL_RANK=1 HOROVOD_LOCAL_SIZE=2 HOROVOD_CROSS_RANK=1
  HOROVOD_CROSS_SIZE=2 HOROVOD_HOSTNAME=hostb HOROVOD_GLOO_RENDEZVOUS_ADDR=10.0.0.1 HOROVOD_GLOO_RENDEZVOUS_PORT=4567
  HOROVOD_CONTROLLER=gloo HOROVOD_CPU_OPERATIONS=gloo)
out=$(plan "${HVD[@]}" "$RUN" --dry-run /bin/true 2>&1)
check "horovod across hosts without --master-addr: exit 2" equals $? 2
check "horovod: says to pass --master-addr" contains "$out" "does not say where rank 0 runs: pass --master-addr"
out=$(plan "${HVD[@]}" "$RUN" --dry-run --master-addr hosta /bin/true)
check "horovod with --master-addr: rank 3, node 1" equals "$(q '[.launcher, (.ranks[0].rank|tostring), (.node_rank|tostring), .master_addr] | join(" ")' "$out")" "horovod 3 1 hosta"

# torchrun (or a hook) already set the contract: passed through.
out=$(plan RANK=1 WORLD_SIZE=4 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 GROUP_WORLD_SIZE=2 MASTER_ADDR=10.1.1.1 \
  MASTER_PORT=29400 TORCHELASTIC_RUN_ID=abc "$RUN" --dry-run /bin/true)
check "torchrun env: passed through" equals "$(q '[.launcher, .mode, (.ranks[0].rank|tostring), .master_addr, (.master_port|tostring)] | join(" ")' "$out")" "env exec 1 10.1.1.1 29400"

# Conflicting and malformed sets: one line, exit 2, naming the variables. (env applies its
# arguments in order, so a variable repeated after the recorded set replaces it.)
bad() {
  local what=$1 want=$2
  shift 2
  local out rc
  out=$(plan "$@" "$RUN" --dry-run /bin/true 2>&1)
  rc=$?
  check "$what: exit 2" equals $rc 2
  check "$what: says '$want'" contains "$out" "$want"
  check "$what: one line" equals "$(wc -l <<<"$out")" 1
}
bad "srun --mpi=pmi2 disagreeing with PMI_RANK" "SLURM_PROCID=1 (SLURM step) and PMI_RANK=2 (MPICH/Intel MPI) disagree" \
  "${SLURM_TASK[@]}" PMI_RANK=2 PMI_SIZE=3
bad "a hook's RANK disagreeing under srun" "SLURM_PROCID=1 (SLURM step) and RANK=0 (torchrun-style env) disagree" \
  "${SLURM_TASK[@]}" RANK=0 WORLD_SIZE=3
bad "mpirun inside an allocation" "use --launcher mpi" "${SLURM_TASK[@]}" "${OMPI[@]/OMPI_COMM_WORLD_RANK=1/OMPI_COMM_WORLD_RANK=0}"
bad "SLURM_PROCID=x" "SLURM_PROCID='x' is not a non-negative integer" "${SLURM_TASK[@]/SLURM_PROCID=1/SLURM_PROCID=x}"
bad "bad step node list" "SLURM_STEP_NODELIST: invalid host list 'node[2-1]'" "${SLURM_TASK[@]}" 'SLURM_STEP_NODELIST=node[2-1]'
bad "tasks per node not adding up" "adds up to 4 tasks but SLURM_STEP_NUM_TASKS=3" \
  "${SLURM_TASK[@]/SLURM_STEP_TASKS_PER_NODE=2,1/SLURM_STEP_TASKS_PER_NODE=2(x2)}"
bad "RANK without WORLD_SIZE" "RANK=2 is set but WORLD_SIZE is not" RANK=2
bad "IDIST_NO_DETECT=maybe" "IDIST_NO_DETECT='maybe'" IDIST_NO_DETECT=maybe

# An outer launcher's marks that give no complete topology: an error, never a world of one.
bad "PMIx without a size (PMIx never exports one)" "PMIX_RANK=0 is set but PMIX_SIZE is not" PMIX_RANK=0 PMIX_NAMESPACE=ns
bad "mpiexec -pmi-port's PMI_ID without PMI_PORT" "PMI_ID is set but PMI_PORT is not" PMI_ID=0
out=$(plan PMIX_RANK=0 PMIX_NAMESPACE=ns "$RUN" --launcher spawn --dry-run /bin/true 2>&1)
check "... --launcher spawn ignores them" equals "$(q .launcher "$out")" spawn

out=$(plan "$RUN" --dry-run --launcher mpi /bin/true 2>&1)
check "--launcher mpi with no MPI variables: exit 2" equals $? 2
check "--launcher mpi with no MPI variables: says so" contains "$out" "--launcher mpi: no mpi variables in the environment"

# Kubeflow PyTorchJob pods (the training operator's setPodEnv, recorded in tests/unit/
# launcher_envs.hpp): a worker of Master + 1 Worker, nprocPerNode 2, in both generations, and
# an elastic worker. Each pod is one node: -n from PET_NPROC_PER_NODE, the pods meet at the
# master's service (or PET_RDZV_ENDPOINT), and the plan names the variables.
PJ_V17=(MASTER_ADDR=mnist-master-0 PET_MASTER_ADDR=mnist-master-0 MASTER_PORT=23456 PET_MASTER_PORT=23456
  WORLD_SIZE=4 RANK=1 PET_NODE_RANK=1 PET_NNODES=2 PET_NPROC_PER_NODE=2 PYTHONUNBUFFERED=1)
PJ_V15=(MASTER_ADDR=mnist-master-0 MASTER_PORT=23456 WORLD_SIZE=2 RANK=1 PET_NPROC_PER_NODE=2 PYTHONUNBUFFERED=0)
PJ_ELASTIC=(PET_RDZV_ENDPOINT=mnist-worker-0:23456 PET_RDZV_BACKEND=c10d PET_NNODES=1:3 PET_MAX_RESTARTS=3
  PET_NPROC_PER_NODE=2 PET_RDZV_ID=mnist-run)
for generation in V17 V15; do
  vars="PJ_$generation[@]"
  out=$(plan "${!vars}" "$RUN" --dry-run /bin/true)
  check "PyTorchJob $generation worker pod: exit 0" equals $? 0
  check "... detected as a PyTorchJob pod" contains "$(q .detected_by "$out")" "Kubeflow PyTorchJob pod"
  check "... node 1 of 2, 2 ranks here, meeting at the master's service" equals \
    "$(q '[.node_rank, .nnodes, .local_world_size, .master_addr] | map(tostring) | join(" ")' "$out")" "1 2 2 mnist-master-0"
  check "... 2 ranks planned" equals "$(q '.ranks | length' "$out")" 2
  check "... -n from PET_NPROC_PER_NODE" equals "$(q .provenance.local_world_size "$out")" PET_NPROC_PER_NODE
done
out=$(plan "${PJ_V17[@]}" "$RUN" --dry-run /bin/true)
check "v1.7: the nodes from PET_NNODES, the node from PET_NODE_RANK" equals \
  "$(q '.provenance.nnodes + " " + .provenance.node_rank' "$out")" "PET_NNODES PET_NODE_RANK"
check "v1.7: the note says WORLD_SIZE counts processes" contains "$(q '.notes | join("|")' "$out")" "WORLD_SIZE=4 counts processes"
out=$(plan "${PJ_V15[@]}" "$RUN" --dry-run /bin/true)
check "before v1.7: the nodes from WORLD_SIZE, counting pods" equals "$(q .provenance.nnodes "$out")" \
  "WORLD_SIZE (pods: no PET_NODE_RANK, the operator before v1.7)"
out=$(plan "${PJ_V15[@]}" "$RUN" --dry-run -n 3 --nnodes 2 /bin/true)
check "the command line wins over the pod" equals "$(q '.local_world_size' "$out")" 3
out=$(plan "${PJ_ELASTIC[@]}" "$RUN" --dry-run /bin/true)
check "elastic pod: 2 ranks here, nodes 1:3 from PET_NNODES" equals "$(q '.local_world_size' "$out")" 2
check "... the rendezvous at PET_RDZV_ENDPOINT" contains "$(q .provenance.master_addr "$out")" "PET_RDZV_ENDPOINT"
check "... restarts from PET_MAX_RESTARTS" equals "$(q '.settings.max_restarts | tostring' "$out") $(q .settings_from.max_restarts "$out")" \
  "3 PET_MAX_RESTARTS"
check "... every rank gets TORCHELASTIC_MAX_RESTARTS=3 and ROLE_NAME" equals \
  "$(q '.ranks[1].env.TORCHELASTIC_MAX_RESTARTS + " " + .ranks[1].env.ROLE_NAME' "$out")" "3 default"
out=$(plan "${PJ_ELASTIC[@]}" MASTER_ADDR=mnist-master-0 PET_MASTER_ADDR=mnist-master-0 MASTER_PORT=23456 \
  PET_MASTER_PORT=23456 RANK=0 PET_NODE_RANK=0 WORLD_SIZE=2 "$RUN" --dry-run /bin/true 2>&1)
check "elastic with a Master (v1.7+): PET_MASTER_* and PET_NODE_RANK set aside, said in a note" equals \
  "$(q '.master_addr + " " + (.notes | map(select(contains("PET_NODE_RANK and PET_MASTER_ADDR ignored"))) | length | tostring)' "$out")" \
  "mnist-worker-0 1"
bad "PyTorchJob PET_NNODES=3:2" "PET_NNODES='3:2': --nnodes 3:2: MIN is above MAX" "${PJ_ELASTIC[@]}" PET_NNODES=3:2
bad "PyTorchJob RANK >= WORLD_SIZE" "Kubeflow PyTorchJob pod: RANK=2 is not below WORLD_SIZE=2 (pods)" "${PJ_V15[@]}" RANK=2
bad "PyTorchJob PET_NPROC_PER_NODE=abc" "PET_NPROC_PER_NODE='abc'" "${PJ_V17[@]}" PET_NPROC_PER_NODE=abc
bad "PyTorchJob WORLD_SIZE of neither convention" "WORLD_SIZE=6 is neither PET_NNODES=2 pods nor PET_NNODES x PET_NPROC_PER_NODE = 4 processes" \
  "${PJ_V17[@]}" WORLD_SIZE=6
bad "PyTorchJob PET_RDZV_BACKEND=zk" "PET_RDZV_BACKEND='zk': --rdzv-backend='zk' is not a rendezvous backend idist-run knows" "${PJ_ELASTIC[@]}" PET_RDZV_BACKEND=zk
# rdzvBackend: etcd: PET_RDZV_BACKEND and PET_RDZV_ENDPOINT are --rdzv-backend and etcd's members.
out=$(plan "${PJ_ELASTIC[@]}" PET_RDZV_BACKEND=etcd PET_RDZV_ENDPOINT=etcd-0:2379,etcd-1:2379 "$RUN" --dry-run /bin/true 2>&1)
check "PyTorchJob PET_RDZV_BACKEND=etcd: exit 0" equals $? 0
check "... --rdzv-backend etcd from PET_RDZV_BACKEND" equals \
  "$(q '.settings.rdzv_backend + " " + .settings_from.rdzv_backend' "$out")" "etcd PET_RDZV_BACKEND"
bad "bare RANK/WORLD_SIZE with -n 2: ambiguous, the refusal names the PyTorchJob form" \
  "in a Kubeflow PyTorchJob pod (RANK and WORLD_SIZE count pods) set nprocPerNode" \
  MASTER_ADDR=mnist-master-0 MASTER_PORT=23456 WORLD_SIZE=2 RANK=1 IDIST_NPROC_PER_NODE=2

finish
