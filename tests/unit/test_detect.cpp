// Launcher detection: environments recorded from real launchers, the priority between sources
// that are present together, and conflicts between them. Beside it: test_detect_values.cpp
// (malformed values, SLURM's tasks-per-node form, ports, uneven layouts) and
// test_detect_pytorchjob.cpp (Kubeflow PyTorchJob pods), built into the same test_detect.
#include <doctest/doctest.h>

#include "detect_helpers.hpp"
#include "idist/launchers/detect.hpp"
#include "launcher_envs.hpp"

using namespace idist::launchers;
using namespace test;

// ---------------------------------------------------------------- recorded environments

TEST_CASE("srun cyclic, task 1: alone on the second node") {
  const auto d = detected(kSrunCyclicTask1);
  CHECK(d.launcher == "slurm");
  CHECK(d.source == "SLURM step");
  CHECK(d.rank.value == 1);
  CHECK(d.rank.from == "SLURM_PROCID");
  CHECK(d.world_size.value == 3);
  CHECK(d.world_size.from == "SLURM_STEP_NUM_TASKS");
  CHECK(d.local_rank.value == 0);
  CHECK(d.local_rank.from == "SLURM_LOCALID");
  // Cyclic puts tasks 0 and 2 on node1: this node's count comes from its entry, not NTASKS / NNODES.
  CHECK(d.local_world_size.value == 1);
  CHECK(d.local_world_size.from == "SLURM_STEP_TASKS_PER_NODE[SLURM_NODEID]");
  CHECK(d.node_rank.value == 1);
  CHECK(d.node_rank.from == "SLURM_NODEID");
  CHECK(d.nnodes.value == 2);
  CHECK(d.nnodes.from == "SLURM_STEP_NUM_NODES");
  REQUIRE(d.master_addr);
  CHECK(d.master_addr->value == "node1");
  CHECK(contains(d.master_addr->from, "SLURM_STEP_NODELIST"));
  CHECK(d.hosts == std::vector<std::string>{"node1", "node2"});
  CHECK(d.tasks_per_node == std::vector<int>{2, 1});
  CHECK(d.job_id == "5");
  CHECK(d.step == 0);
  CHECK(contains(d.job_id_from, "SLURM_JOB_ID"));
  CHECK_FALSE(d.master_port);
}

TEST_CASE("srun cyclic, task 2: second task on the first node") {
  const auto d = detected(kSrunCyclicTask2);
  CHECK(d.rank.value == 2);
  CHECK(d.local_rank.value == 1);
  CHECK(d.local_world_size.value == 2);
  CHECK(d.node_rank.value == 0);
  CHECK(d.nnodes.value == 2);
  CHECK(d.master_addr->value == "node1");
}

TEST_CASE("an sbatch batch script is not a step: nothing detected, and a note says why") {
  const auto d = detect(from(kSbatchScript));
  CHECK_FALSE(d.found);
  CHECK(any_note(d, "SLURM_STEP_ID"));
  // Asking for SLURM there is an error rather than rank 0 of 4.
  CHECK(contains(detect_error(kSbatchScript, "slurm"), "--launcher slurm"));
}

TEST_CASE("mpirun (Open MPI 4.1) with PMIX_RANK agreeing") {
  const auto d = detected(kOmpiRank1);
  CHECK(d.launcher == "mpi");
  CHECK(d.source == "Open MPI");
  CHECK(d.rank.value == 1);
  CHECK(d.rank.from == "OMPI_COMM_WORLD_RANK");
  CHECK(d.world_size.value == 2);
  CHECK(d.local_rank.value == 1);
  CHECK(d.local_world_size.value == 2);
  // OMPI_COMM_WORLD_NODE_RANK=1 is a rank within the node, not the node's index.
  CHECK(d.node_rank.value == 0);
  CHECK(d.nnodes.value == 1);
  CHECK(d.nnodes.from == "OMPI_MCA_orte_num_nodes");
  CHECK(d.job_id == "146997249");
  CHECK(d.job_id_from == "OMPI_MCA_ess_base_jobid");
  CHECK_FALSE(d.master_addr);
  CHECK(d.hosts.empty());
  CHECK(detected(kOmpiRank0).job_id == d.job_id);
}

TEST_CASE("horovodrun gloo mode, rank 3 of 2 hosts x 2 slots") {
  const auto d = detected(kHorovodRank3);
  CHECK(d.launcher == "horovod");
  CHECK(d.source == "horovodrun");
  CHECK(d.rank.value == 3);
  CHECK(d.world_size.value == 4);
  CHECK(d.local_rank.value == 1);
  CHECK(d.local_world_size.value == 2);
  CHECK(d.node_rank.value == 1);
  CHECK(d.node_rank.from == "HOROVOD_CROSS_RANK");
  CHECK(d.nnodes.value == 2);
  CHECK(d.job_id == "10.0.0.1:4567");
  CHECK_FALSE(d.master_addr);  // the rendezvous server is the driver's, not rank 0's host
}

TEST_CASE("MPICH/Hydra: the node index is derived, and says it assumes") {
  const auto d = detected(kHydraRank2);
  CHECK(d.launcher == "mpi");
  CHECK(d.source == "MPICH/Intel MPI");
  CHECK(d.rank.value == 2);
  CHECK(d.world_size.value == 4);
  CHECK(d.local_rank.value == 0);
  CHECK(d.local_world_size.value == 2);
  CHECK(d.node_rank.value == 1);
  CHECK(contains(d.node_rank.from, "assumes"));
  CHECK(d.nnodes.value == 2);
  CHECK(contains(d.nnodes.from, "PMI_SIZE"));
  // The job's name comes from the PMI server (fake_pmi here): unique per mpiexec.
  CHECK(d.job_id == "kvs_4242_0_12345_hosta");
  CHECK(contains(d.job_id_from, "PMI_FD=5"));
}

TEST_CASE("MPICH/Hydra: the PMI server is asked only when something is missing") {
  int asked = 0;
  const PmiClient counting = [&](const PmiEndpoint& e) {
    ++asked;
    return fake_pmi(e);
  };
  // --master-port or --rdzv-id given: PMI_FD stays untouched for an MPICH program to use.
  auto d = detect(from(kHydraRank2), {.job_id_needed = false, .pmi = counting});
  CHECK(asked == 0);
  CHECK(d.found->job_id.empty());
  // A job script's MASTER_PORT says where rank 0 is: nothing to ask either.
  detect(from(with(kHydraRank2, {{"MASTER_PORT", "29600"}})), {.pmi = counting});
  CHECK(asked == 0);
  detect(from(kHydraRank2), {.pmi = counting});
  CHECK(asked == 1);
}

TEST_CASE("mpiexec -pmi-port: rank and size from the PMI server, never a world of one") {
  const Env port_mode = {{"PMI_PORT", "hosta:36411"}, {"PMI_ID", "2"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "2"}};
  const auto d = detected(port_mode);
  CHECK(d.rank.value == 2);
  CHECK(d.world_size.value == 4);
  CHECK(contains(d.rank.from, "PMI server"));
  CHECK(d.node_rank.value == 1);
  CHECK(d.job_id == "kvs_4242_0_12345_hosta");
  // Even with the topology known, the job id is asked for (by a -pmi-port session, which an
  // MPICH program can open again).
  PmiEndpoint seen;
  detect(from(port_mode), {.pmi = [&](const PmiEndpoint& e) {
           seen = e;
           return fake_pmi(e);
         }});
  CHECK(seen.host == "hosta");
  CHECK(seen.port == 36411);
  CHECK(seen.id == 2);
  CHECK(contains(detect_error(with(port_mode, {{"PMI_PORT", "hosta"}})), "PMI_PORT='hosta' is not HOST:PORT"));
  CHECK(contains(detect_error(without(port_mode, {"PMI_PORT"})), "PMI_ID is set but PMI_PORT is not"));
  CHECK(contains(detect_error(with(port_mode, {{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}})), "disagree"));
  // A server that cannot be reached is an error naming it, not a world of one.
  const auto unreachable = [](const PmiEndpoint& e) -> PmiAnswer { throw DetectError(e.from + ": cannot connect"); };
  CHECK_THROWS_WITH_AS(detect(from(port_mode), {.pmi = unreachable}), "PMI_PORT=hosta:36411 PMI_ID=2: cannot connect",
                       DetectError);
}

TEST_CASE("an outer launcher's marks that no detector can complete are an error, never a world of one") {
  const auto msg = detect_error({{"PMIX_RANK", "1"}, {"PMIX_NAMESPACE", "ns"}});
  CHECK(contains(msg, "PMIX_RANK=1"));
  CHECK(contains(msg, "PMIX_SIZE"));
  // Configuration variables are no marks: plain `idist-run -n 2` keeps working with them set.
  const auto d = detect(from({{"OMPI_MCA_btl", "self,vader"}, {"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"SLURM_JOB_ID", "7"}}));
  CHECK_FALSE(d.found);
}

TEST_CASE("MVAPICH") {
  const auto d = detected({{"MV2_COMM_WORLD_RANK", "5"},
                           {"MV2_COMM_WORLD_SIZE", "8"},
                           {"MV2_COMM_WORLD_LOCAL_RANK", "1"},
                           {"MV2_COMM_WORLD_LOCAL_SIZE", "4"}});
  CHECK(d.launcher == "mpi");
  CHECK(d.source == "MVAPICH");
  CHECK(d.rank.value == 5);
  CHECK(d.rank.from == "MV2_COMM_WORLD_RANK");
  CHECK(d.world_size.value == 8);
  CHECK(d.local_rank.value == 1);
  CHECK(d.local_world_size.value == 4);
  CHECK(d.node_rank.value == 1);
  CHECK(d.nnodes.value == 2);
}

TEST_CASE("PMIx alone") {
  SUBCASE("with PMIX_SIZE and the local variables") {
    const auto d = detected({{"PMIX_RANK", "1"},
                             {"PMIX_SIZE", "2"},
                             {"PMIX_LOCAL_RANK", "1"},
                             {"PMIX_LOCAL_SIZE", "2"},
                             {"PMIX_NAMESPACE", "prterun-host-1234@1"}});
    CHECK(d.source == "PMIx");
    CHECK(d.world_size.value == 2);
    CHECK(d.world_size.from == "PMIX_SIZE");
    CHECK(d.nnodes.value == 1);
    CHECK(d.job_id == "prterun-host-1234@1");
  }
  SUBCASE("with PMIX_SIZE but no local variables: which ranks share a node is unknown") {
    const auto msg = detect_error({{"PMIX_RANK", "1"}, {"PMIX_SIZE", "2"}});
    CAPTURE(msg);
    CHECK(contains(msg, "PMIX_LOCAL_RANK"));
  }
  SUBCASE("without any size: PMIx never exports one, so it is not enough; alone it is an error, not a world of one") {
    const Env env = {{"PMIX_RANK", "1"}, {"PMIX_NAMESPACE", "ns"}};
    CHECK(contains(detect_error(env), "PMIX_RANK=1 is set but PMIX_SIZE is not"));
    // Forced, too, it is an error saying what is missing.
    const auto msg = detect_error(env, "mpi");
    CAPTURE(msg);
    CHECK(contains(msg, "PMIX_SIZE"));
    CHECK(contains(msg, "PMIX_RANK=1"));
  }
}

TEST_CASE("torchrun's env is passed through") {
  const auto d = detected(kTorchrunRank1);
  CHECK(d.launcher == "env");
  CHECK(d.source == "torchrun-style env");
  CHECK(d.rank.value == 1);
  CHECK(d.rank.from == "RANK");
  CHECK(d.world_size.value == 4);
  CHECK(d.local_rank.value == 1);
  CHECK(d.local_world_size.value == 2);
  CHECK(d.node_rank.value == 0);
  CHECK(d.node_rank.from == "GROUP_RANK");
  CHECK(d.nnodes.value == 2);
  CHECK(d.nnodes.from == "GROUP_WORLD_SIZE");
  REQUIRE(d.master_addr);
  CHECK(d.master_addr->value == "10.1.1.1");
  REQUIRE(d.master_port);
  CHECK(d.master_port->value == 29400);
  CHECK(d.master_port->from == "MASTER_PORT");
  CHECK(d.job_id == "abc");
}

TEST_CASE("torch's bare RANK/WORLD_SIZE means one node") {
  const auto d = detected({{"RANK", "2"}, {"WORLD_SIZE", "3"}});
  CHECK(d.local_rank.value == 2);
  CHECK(d.local_world_size.value == 3);
  CHECK(d.nnodes.value == 1);
  CHECK(d.node_rank.value == 0);
}

TEST_CASE("no launcher variables at all: nothing detected") {
  const auto d = detect(from({{"PATH", "/usr/bin"}, {"HOME", "/root"}}));
  CHECK_FALSE(d.found);
  CHECK(d.notes.empty());
}

// ---------------------------------------------------------------- priority

TEST_CASE("a SLURM step wins over Open MPI when they agree") {
  // srun --mpi=pmix of an Open MPI program on one node, task 1 of 2.
  const Env env = {{"SLURM_JOB_ID", "9"},          {"SLURM_STEP_ID", "1"},         {"SLURM_PROCID", "1"},
                   {"SLURM_LOCALID", "1"},         {"SLURM_NODEID", "0"},          {"SLURM_STEP_NUM_TASKS", "2"},
                   {"SLURM_STEP_NUM_NODES", "1"},  {"SLURM_STEP_TASKS_PER_NODE", "2"},
                   {"SLURM_STEP_NODELIST", "n1"},  {"OMPI_COMM_WORLD_RANK", "1"},  {"OMPI_COMM_WORLD_SIZE", "2"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                   {"PMIX_RANK", "1"}};
  const auto d = detected(env);
  CHECK(d.launcher == "slurm");
  CHECK(d.rank.from == "SLURM_PROCID");
  CHECK(d.step == 1);
}

TEST_CASE("Open MPI wins over MPICH variables that agree") {
  const auto d = detected(with(kOmpiRank1, {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}));
  CHECK(d.source == "Open MPI");
}

TEST_CASE("MPI wins over horovodrun and torch variables that agree") {
  const auto d = detected(with(kHydraRank2, {{"HOROVOD_RANK", "2"}, {"HOROVOD_SIZE", "4"}, {"RANK", "2"},
                                             {"WORLD_SIZE", "4"}}));
  CHECK(d.source == "MPICH/Intel MPI");
  CHECK(detected(with(kHorovodRank3, {{"RANK", "3"}, {"WORLD_SIZE", "4"}})).source == "horovodrun");
}

TEST_CASE("a SLURM step wins over a container hook's RANK that agrees") {
  const auto d = detected(with(kSrunCyclicTask1, {{"RANK", "1"}, {"WORLD_SIZE", "3"}, {"LOCAL_RANK", "0"}}));
  CHECK(d.launcher == "slurm");
}

TEST_CASE("--launcher forces one kind, even against a disagreeing SLURM step") {
  // mpirun inside an allocation: the ranks inherit the env of the srun step that started orted.
  const auto env = with(kSrunCyclicTask1, kOmpiRank0);
  const auto detection = detect(from(env), {.launcher = "mpi"});
  REQUIRE(detection.found);
  CHECK(detection.found->source == "Open MPI");
  CHECK(detection.found->rank.value == 0);
  CHECK(any_note(detection, "ignoring SLURM step"));

  CHECK(detected(with(kSrunCyclicTask1, {{"RANK", "0"}, {"WORLD_SIZE", "8"}}), "env").launcher == "env");
}

TEST_CASE("--launcher naming a kind that is not there is an error") {
  for (const auto* launcher : {"mpi", "slurm", "horovod", "env"}) {
    CAPTURE(launcher);
    CHECK(contains(detect_error({}, launcher), "--launcher " + std::string(launcher)));
  }
  CHECK(contains(detect_error(kOmpiRank1, "horovod"), "no horovod variables"));
}

TEST_CASE("--launcher mpi: sources of the same kind must still agree") {
  const auto msg = detect_error(with(kOmpiRank1, {{"PMIX_RANK", "0"}}), "mpi");
  CAPTURE(msg);
  CHECK(contains(msg, "OMPI_COMM_WORLD_RANK=1"));
  CHECK(contains(msg, "PMIX_RANK=0"));
}

// ---------------------------------------------------------------- conflicts

TEST_CASE("srun --mpi=pmi2 with a stale PMI_RANK: both values in the message") {
  const auto msg = detect_error(with(kSrunCyclicTask1, {{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}}));
  CAPTURE(msg);
  CHECK(contains(msg, "SLURM_PROCID=1"));
  CHECK(contains(msg, "PMI_RANK=2"));
}

TEST_CASE("a container hook's RANK that disagrees with SLURM") {
  const auto msg = detect_error(with(kSrunCyclicTask1, {{"RANK", "3"}, {"WORLD_SIZE", "3"}}));
  CAPTURE(msg);
  CHECK(contains(msg, "SLURM_PROCID=1"));
  CHECK(contains(msg, "RANK=3"));
  CHECK(contains(msg, "--launcher"));
}

TEST_CASE("a hook that sets RANK alone under SLURM need only agree with it") {
  CHECK(detected(with(kSrunCyclicTask1, {{"RANK", "1"}})).launcher == "slurm");
  const auto msg = detect_error(with(kSrunCyclicTask1, {{"RANK", "3"}}));
  CAPTURE(msg);
  CHECK(contains(msg, "SLURM_PROCID=1"));
  CHECK(contains(msg, "RANK=3"));
  // Winning, it must be complete.
  CHECK(contains(detect_error({{"RANK", "3"}}), "WORLD_SIZE"));
}

TEST_CASE("mpirun inside a SLURM allocation: the message says --launcher mpi") {
  const auto msg = detect_error(with(kSrunCyclicTask1, kOmpiRank0));
  CAPTURE(msg);
  CHECK(contains(msg, "SLURM_PROCID=1"));
  CHECK(contains(msg, "OMPI_COMM_WORLD_RANK=0"));
  CHECK(contains(msg, "--launcher mpi"));
}

TEST_CASE("sizes that disagree are conflicts too") {
  const auto msg = detect_error(with(kOmpiRank1, {{"PMI_RANK", "1"}, {"PMI_SIZE", "4"}}));
  CAPTURE(msg);
  CHECK(contains(msg, "OMPI_COMM_WORLD_SIZE=2"));
  CHECK(contains(msg, "PMI_SIZE=4"));
}
