#pragma once
// Environments recorded from real launchers (srun, sbatch, mpirun, horovodrun, Hydra,
// torchrun), shared by test_detect and test_plan, and the helpers that turn a variable map
// into the env::Lookup that detect() and make_plan() take instead of the process env.

#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "idist/env_contract.hpp"
#include "idist/launchers/pmi.hpp"

namespace test {

using Env = std::map<std::string, std::string>;

// Unless a test names one, cpu claims live in a directory that never exists: the machine's
// (/run/lock/idist-cpu-claims) changes whenever a test beside this one runs idist-run, and with
// it what make_plan binds.
inline idist::env::Lookup from(Env vars) {
  vars.try_emplace("IDIST_CPU_CLAIMS", "/nonexistent/idist-test-cpu-claims");
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// Hydra's PMI server as the recorded envs' PMI_FD/PMI_PORT would answer: the job's name, and
// with PMI_PORT (mpiexec -pmi-port) rank 2 of 4. Tests never talk to a real descriptor.
inline idist::launchers::PmiAnswer fake_pmi(const idist::launchers::PmiEndpoint& endpoint) {
  idist::launchers::PmiAnswer answer{.kvsname = "kvs_4242_0_12345_hosta", .rank = std::nullopt, .size = std::nullopt};
  if (endpoint.fd < 0) {
    answer.rank = 2;
    answer.size = 4;
  }
  return answer;
}

// `base` with `changes` set over it (a recorded env plus what a test adds or alters).
inline Env with(Env base, const Env& changes) {
  for (const auto& [name, value] : changes) base[name] = value;
  return base;
}

inline Env without(Env base, std::initializer_list<std::string_view> names) {
  for (auto name : names) base.erase(std::string(name));
  return base;
}

inline bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

// srun -N2 -n3 --distribution=cyclic: task 1 is the only task on node2, task 2 the second on node1.
inline const Env kSrunCyclicTask1 = {
    {"SLURM_JOB_ID", "5"},          {"SLURM_STEP_ID", "0"},          {"SLURM_STEPID", "0"},
    {"SLURM_PROCID", "1"},          {"SLURM_LOCALID", "0"},          {"SLURM_NODEID", "1"},
    {"SLURM_NTASKS", "3"},          {"SLURM_STEP_NUM_TASKS", "3"},   {"SLURM_STEP_NUM_NODES", "2"},
    {"SLURM_NNODES", "2"},          {"SLURM_STEP_TASKS_PER_NODE", "2,1"},
    {"SLURM_TASKS_PER_NODE", "2,1"}, {"SLURM_STEP_NODELIST", "node[1-2]"},
    {"SLURM_NODELIST", "node[1-2]"}, {"SLURM_JOB_NODELIST", "node[1-2]"},
    {"SLURM_DISTRIBUTION", "cyclic"},
};
inline const Env kSrunCyclicTask2 =
    with(kSrunCyclicTask1, {{"SLURM_PROCID", "2"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "0"}});

// srun -N2 --ntasks-per-node=1: one task per node, the usual way to run `idist-run -n K` per node.
inline const Env kSrunOnePerNodeTask1 = {
    {"SLURM_JOB_ID", "7"},          {"SLURM_STEP_ID", "0"},           {"SLURM_PROCID", "1"},
    {"SLURM_LOCALID", "0"},         {"SLURM_NODEID", "1"},            {"SLURM_NTASKS", "2"},
    {"SLURM_STEP_NUM_TASKS", "2"},  {"SLURM_STEP_NUM_NODES", "2"},    {"SLURM_NNODES", "2"},
    {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}, {"SLURM_TASKS_PER_NODE", "1(x2)"},
    {"SLURM_STEP_NODELIST", "node[1-2]"},   {"SLURM_NODELIST", "node[1-2]"},
};

// The batch script of `sbatch -N2 -n4`: SLURM_PROCID and SLURM_NTASKS are set, SLURM_STEP_ID is not.
inline const Env kSbatchScript = {
    {"SLURM_JOB_ID", "6"},   {"SLURM_PROCID", "0"},  {"SLURM_NTASKS", "4"},
    {"SLURM_NNODES", "2"},   {"SLURM_NODEID", "0"},  {"SLURM_LOCALID", "0"},
    {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"SLURM_NODELIST", "node[1-2]"}, {"SLURM_JOB_NODELIST", "node[1-2]"},
};

// mpirun -np 2 (Open MPI 4.1), rank 1; both ranks on one host.
inline const Env kOmpiRank1 = {
    {"OMPI_COMM_WORLD_RANK", "1"},       {"OMPI_COMM_WORLD_SIZE", "2"},
    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
    {"OMPI_COMM_WORLD_NODE_RANK", "1"},  {"OMPI_MCA_ess_base_jobid", "146997249"},
    {"OMPI_MCA_orte_num_nodes", "1"},    {"OMPI_UNIVERSE_SIZE", "2"},
    {"PMIX_RANK", "1"},                  {"PMIX_NAMESPACE", "146997249"},
};
inline const Env kOmpiRank0 = with(kOmpiRank1, {{"OMPI_COMM_WORLD_RANK", "0"},
                                                {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                                {"OMPI_COMM_WORLD_NODE_RANK", "0"},
                                                {"PMIX_RANK", "0"}});

// horovodrun in gloo mode, 2 hosts x 2 slots, rank 3 (second slot of hostb).
inline const Env kHorovodRank3 = {
    {"HOROVOD_RANK", "3"},          {"HOROVOD_SIZE", "4"},
    {"HOROVOD_LOCAL_RANK", "1"},    {"HOROVOD_LOCAL_SIZE", "2"},
    {"HOROVOD_CROSS_RANK", "1"},    {"HOROVOD_CROSS_SIZE", "2"},
    {"HOROVOD_HOSTNAME", "hostb"},  {"HOROVOD_GLOO_RENDEZVOUS_ADDR", "10.0.0.1"},
    {"HOROVOD_GLOO_RENDEZVOUS_PORT", "4567"}, {"HOROVOD_CONTROLLER", "gloo"},
    {"HOROVOD_CPU_OPERATIONS", "gloo"},
};

// MPICH's Hydra (mpiexec -n 4 -ppn 2), rank 2: the first rank on the second host.
inline const Env kHydraRank2 = {
    {"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "2"}, {"PMI_FD", "5"},
};

// torchrun --nnodes 2 --nproc-per-node 2, rank 1 (second process of node 0).
inline const Env kTorchrunRank1 = {
    {"RANK", "1"},          {"WORLD_SIZE", "4"},        {"LOCAL_RANK", "1"},
    {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "0"},     {"GROUP_WORLD_SIZE", "2"},
    {"MASTER_ADDR", "10.1.1.1"}, {"MASTER_PORT", "29400"}, {"TORCHELASTIC_RUN_ID", "abc"},
};

// A Kubeflow PyTorchJob "mnist" (Master x1 + Worker x1, the master's pytorchjob-port 23456,
// nprocPerNode "2"), as the training operator's setPodEnv writes the worker pod's variables
// (kubeflow/training-operator, pkg/controller.v1/pytorch/envvar.go and master.go).
// v1.7 and later: PET_* beside the plain ones, WORLD_SIZE = pods x nprocPerNode.
inline const Env kPyTorchJobWorkerV17 = {
    {"PYTHONUNBUFFERED", "1"},         {"MASTER_PORT", "23456"},         {"PET_MASTER_PORT", "23456"},
    {"MASTER_ADDR", "mnist-master-0"}, {"PET_MASTER_ADDR", "mnist-master-0"}, {"WORLD_SIZE", "4"},
    {"RANK", "1"},                     {"PET_NODE_RANK", "1"},           {"PET_NPROC_PER_NODE", "2"},
    {"PET_NNODES", "2"},
};
// Before v1.7 (v1.5's envvar.go): WORLD_SIZE counts pods, no PET_* but an elasticPolicy's
// (PET_NPROC_PER_NODE from elasticPolicy.nProcPerNode, here set in the pod spec by hand).
inline const Env kPyTorchJobWorkerV15 = {
    {"PYTHONUNBUFFERED", "0"}, {"MASTER_PORT", "23456"}, {"MASTER_ADDR", "mnist-master-0"},
    {"WORLD_SIZE", "2"},       {"RANK", "1"},            {"PET_NPROC_PER_NODE", "2"},
};
// An elastic PyTorchJob (Worker x3, elasticPolicy minReplicas 1, maxReplicas 3, maxRestarts 3,
// rdzvId "mnist-run"), any worker pod (elastic.go): the pods meet at worker 0.
inline const Env kPyTorchJobElastic = {
    {"PYTHONUNBUFFERED", "1"},     {"PET_RDZV_ENDPOINT", "mnist-worker-0:23456"}, {"PET_RDZV_BACKEND", "c10d"},
    {"PET_NNODES", "1:3"},         {"PET_MAX_RESTARTS", "3"},                      {"PET_NPROC_PER_NODE", "2"},
    {"PET_RDZV_ID", "mnist-run"},  {"PET_MONITOR_INTERVAL", "5"},
};

}  // namespace test
