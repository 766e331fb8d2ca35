// What -n auto and --bind read from the node: GPUs (driver entries narrowed by
// CUDA_VISIBLE_DEVICES), NUMA nodes, and how cores are shared out among local ranks.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "common/cpus_shared.hpp"
#include "idist/common/host.hpp"
#include "idist/launchers/cpu_claims.hpp"
#include "idist/launchers/resources.hpp"

namespace fs = std::filesystem;
using idist::launchers::allotted_cpus;
using idist::launchers::core_of_cpu;
using idist::launchers::cpu_list;
using idist::launchers::cpu_shares;
using idist::launchers::numa_node_of_cpu;
using idist::launchers::visible_gpus;

namespace {

// A fake /proc/driver/nvidia/gpus (or /sys/devices/system/node) in a temporary directory.
struct TempDir {
  fs::path path = fs::temp_directory_path() / ("idist-resources-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

idist::env::Lookup env_with(std::map<std::string, std::string> vars) {
  return [vars](std::string_view name) -> std::optional<std::string> {
    const auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace

TEST_CASE("visible GPUs: the driver's entries, narrowed by CUDA_VISIBLE_DEVICES as CUDA does") {
  TempDir dir;
  CHECK(visible_gpus(env_with({}), dir.path / "absent").count == 0);
  CHECK(visible_gpus(env_with({{"CUDA_VISIBLE_DEVICES", "0,1"}}), dir.path).count == 0);  // no driver, no GPU
  for (const char* bus : {"0000:01:00.0", "0000:41:00.0", "0000:81:00.0", "0000:c1:00.0"})
    fs::create_directories(dir.path / bus);
  CHECK(visible_gpus(env_with({}), dir.path).count == 4);
  CHECK(visible_gpus(env_with({{"CUDA_VISIBLE_DEVICES", "2,3"}}), dir.path).count == 2);
  CHECK(visible_gpus(env_with({{"CUDA_VISIBLE_DEVICES", ""}}), dir.path).count == 0);
  CHECK(visible_gpus(env_with({{"CUDA_VISIBLE_DEVICES", "-1"}}), dir.path).count == 0);
  CHECK(visible_gpus(env_with({{"CUDA_VISIBLE_DEVICES", "0,7,1"}}), dir.path).count == 1);  // 7: no such GPU, stop
  CHECK(visible_gpus(env_with({{"CUDA_VISIBLE_DEVICES", "GPU-8f3a,GPU-11c2"}}), dir.path).count == 2);
  const auto said = visible_gpus(env_with({{"CUDA_VISIBLE_DEVICES", "1"}}), dir.path);
  CHECK(said.why == "1 GPU(s) (CUDA_VISIBLE_DEVICES=1)");
}

TEST_CASE("NUMA nodes from /sys/devices/system/node/node*/cpulist") {
  TempDir dir;
  fs::create_directories(dir.path / "node0");
  fs::create_directories(dir.path / "node1");
  fs::create_directories(dir.path / "power");  // not a node
  std::ofstream(dir.path / "node0" / "cpulist") << "0-3,8-11\n";
  std::ofstream(dir.path / "node1" / "cpulist") << "4-7,12-15\n";
  const auto numa = numa_node_of_cpu(dir.path);
  CHECK(numa.size() == 16);
  CHECK(numa.at(9) == 0);
  CHECK(numa.at(12) == 1);
  CHECK(numa_node_of_cpu(dir.path / "absent").empty());
}

TEST_CASE("cores are shared out in contiguous shares that keep to one NUMA node where they can") {
  const std::vector<int> eight = {0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(cpu_shares(eight, 2) == std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(cpu_shares(eight, 3) == std::vector<std::vector<int>>{{0, 1, 2}, {3, 4, 5}, {6, 7}});
  CHECK(cpu_shares(eight, 1) == std::vector<std::vector<int>>{eight});
  // Hyperthread-style numbering: even cores on node 0, odd on node 1. Two ranks get a node each.
  std::map<int, int> interleaved;
  for (int c : eight) interleaved[c] = c % 2;
  CHECK(cpu_shares(eight, 2, interleaved) == std::vector<std::vector<int>>{{0, 2, 4, 6}, {1, 3, 5, 7}});
  CHECK(cpu_shares(eight, 4, interleaved) == std::vector<std::vector<int>>{{0, 2}, {4, 6}, {1, 3}, {5, 7}});
  // More ranks than cores: they take turns.
  CHECK(cpu_shares({0, 1}, 5) == std::vector<std::vector<int>>{{0}, {1}, {0}, {1}, {0}});
  // A restricted mask (a cgroup, an outer launcher's binding) is all there is to share.
  CHECK(cpu_shares({2, 3, 6, 7}, 2) == std::vector<std::vector<int>>{{2, 3}, {6, 7}});
  CHECK(cpu_shares({}, 2) == std::vector<std::vector<int>>{{}, {}});
}

TEST_CASE("hyperthreads of one core stay in one share") {
  // Intel's numbering: cpus 0-3 are cores 0-3, cpus 4-7 their second threads.
  const std::vector<int> eight = {0, 1, 2, 3, 4, 5, 6, 7};
  std::map<int, int> core;
  for (int c : eight) core[c] = c % 4;
  CHECK(cpu_shares(eight, 2, {}, core) == std::vector<std::vector<int>>{{0, 4, 1, 5}, {2, 6, 3, 7}});
  CHECK(cpu_shares(eight, 4, {}, core) == std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
}

TEST_CASE("cores from /sys/devices/system/cpu/cpu*/topology") {
  TempDir dir;
  const auto write = [](const fs::path& file, const std::string& text) {
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text << "\n";
  };
  for (int c = 0; c < 4; ++c) {
    write(dir.path / ("cpu" + std::to_string(c)) / "topology" / "physical_package_id", c < 2 ? "0" : "1");
    write(dir.path / ("cpu" + std::to_string(c)) / "topology" / "core_id", std::to_string(c % 2));
  }
  fs::create_directories(dir.path / "cpufreq");  // not a cpu
  const auto core = core_of_cpu(dir.path);
  CHECK(core.size() == 4);
  CHECK(core.at(0) != core.at(1));
  CHECK(core.at(0) != core.at(2));  // the same core id in another package is another core
  CHECK(core_of_cpu(dir.path / "absent").empty());
}

TEST_CASE("the cpus allotted before anyone binds: the cgroup's cpuset, else the online cpus") {
  TempDir dir;
  const auto write = [](const fs::path& file, const std::string& text) {
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text << "\n";
  };
  write(dir.path / "online", "0-7");
  // cgroup v1, as in a container: the cpuset controller's own line.
  write(dir.path / "v1" / "cgroup", "4:memory:/job\n3:cpuset:/job\n0::/");
  write(dir.path / "root" / "cpuset" / "job" / "cpuset.effective_cpus", "2-3,6");
  auto a = allotted_cpus(dir.path / "v1" / "cgroup", dir.path / "root", dir.path / "online");
  CHECK(a.cpus == std::vector<int>{2, 3, 6});
  CHECK(a.source == "cgroup cpuset 2-3,6");
  // cgroup v2: the one hierarchy's line.
  write(dir.path / "v2" / "cgroup", "0::/slice/job.scope");
  write(dir.path / "root" / "slice" / "job.scope" / "cpuset.cpus.effective", "0-3");
  CHECK(allotted_cpus(dir.path / "v2" / "cgroup", dir.path / "root", dir.path / "online").cpus ==
        std::vector<int>{0, 1, 2, 3});
  // No cpuset file (the controller off): the online cpus.
  write(dir.path / "none" / "cgroup", "0::/elsewhere");
  a = allotted_cpus(dir.path / "none" / "cgroup", dir.path / "root", dir.path / "online");
  CHECK(a.cpus.size() == 8);
  CHECK(a.source == "online cpus 0-7");
  CHECK(allotted_cpus(dir.path / "absent", dir.path / "absent", dir.path / "absent").cpus.empty());
  // This machine: the mask is within what it allots.
  const auto here = allotted_cpus();
  for (int c : idist::launchers::usable_cpus())
    CHECK((here.cpus.empty() || std::binary_search(here.cpus.begin(), here.cpus.end(), c)));
}

TEST_CASE("cpu lists are written as the kernel writes them") {
  CHECK(cpu_list({0, 1, 2, 3}) == "0-3");
  CHECK(cpu_list({5, 0, 2, 1}) == "0-2,5");
  CHECK(cpu_list({7}) == "7");
  CHECK(cpu_list({}).empty());
}

TEST_CASE("usable cpus: this process's affinity mask, never empty") {
  const auto cpus = idist::launchers::usable_cpus();
  CHECK_FALSE(cpus.empty());
  CHECK(std::is_sorted(cpus.begin(), cpus.end()));
}

TEST_CASE("cpu claims: all or none, seen by others while held, gone with their holder") {
  using idist::launchers::claimed_cpus;
  using idist::launchers::CpuClaims;
  TempDir tmp;
  const auto dir = tmp.path / "claims";
  CHECK(claimed_cpus({0, 1, 2}, dir).empty());  // no directory yet: nobody claimed anything
  {
    CpuClaims job_a;
    CHECK(job_a.claim_all({0, 1}, dir));
    CHECK(job_a.cpus() == std::vector<int>{0, 1});
    // flock(2) locks belong to the open file: another open of the same file is another
    // claimant, as another job's would be.
    CHECK(claimed_cpus({0, 1, 2, 3}, dir) == std::vector<int>{0, 1});
    CpuClaims job_b;
    CHECK_FALSE(job_b.claim_all({1, 2}, dir));
    CHECK(job_b.cpus().empty());  // none of them, not cpu 2 alone
    CHECK(claimed_cpus({2}, dir).empty());
    job_b.claim_free({0, 1, 2, 3}, dir);
    CHECK(job_b.cpus() == std::vector<int>{2, 3});
    CpuClaims moved = std::move(job_b);
    CHECK(moved.cpus() == std::vector<int>{2, 3});
    CHECK(claimed_cpus({0, 1, 2, 3}, dir) == std::vector<int>{0, 1, 2, 3});
  }
  CHECK(claimed_cpus({0, 1, 2, 3}, dir).empty());
  // Sticky and writable by all, as /tmp: every user's jobs share the machine's cpus.
  CHECK((fs::status(dir).permissions() & fs::perms::all) == fs::perms::all);
  CHECK((fs::status(dir).permissions() & fs::perms::sticky_bit) == fs::perms::sticky_bit);
}

TEST_CASE("cpu claims where the directory cannot be used: nothing claimed, nothing refused") {
  using idist::launchers::claimed_cpus;
  using idist::launchers::CpuClaims;
  TempDir tmp;
  // A link planted where the directory should be is not followed.
  fs::create_directories(tmp.path / "elsewhere");
  fs::create_directory_symlink(tmp.path / "elsewhere", tmp.path / "link");
  CpuClaims claims;
  CHECK(claims.claim_all({0}, tmp.path / "link"));
  CHECK(claims.cpus().empty());
  CHECK_FALSE(fs::exists(tmp.path / "elsewhere" / "cpu0"));
  std::ofstream(tmp.path / "file") << "not a directory";
  CHECK(claims.claim_all({0}, tmp.path / "file"));
  CHECK(claimed_cpus({0}, tmp.path / "file").empty());
  CHECK(idist::launchers::cpu_claims_dir(env_with({})) == "/run/lock/idist-cpu-claims");
  CHECK(idist::launchers::cpu_claims_dir(env_with({{"IDIST_CPU_CLAIMS", "/x"}})) == "/x");
}

TEST_CASE("a job bound by default lets go when another runs unbound for want of cpus: its processes unbound too") {
  using idist::launchers::CpuClaims;
  using idist::launchers::HeldBinding;
  using idist::launchers::UnboundMark;
  TempDir tmp;
  const auto dir = tmp.path / "claims";
  const auto mask = idist::launchers::usable_cpus();
  CpuClaims claims;
  REQUIRE(claims.claim_all(mask, dir));
  HeldBinding bound(HeldBinding::Role::bound_by_default, std::move(claims), mask, dir);
  // A rank of ours, pinned to the first cpu as a bound rank is.
  const pid_t rank = ::fork();
  if (rank == 0) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(mask.front(), &one);
    ::sched_setaffinity(0, sizeof(one), &one);
    ::execlp("sleep", "sleep", "30", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto affinity = [&] {
    std::ifstream status("/proc/" + std::to_string(rank) + "/status");
    for (std::string line; std::getline(status, line);)
      if (line.starts_with("Cpus_allowed_list:")) return line.substr(line.find_first_not_of(" \t", 18));
    return std::string();
  };
  for (int i = 0; i < 100 && affinity() != std::to_string(mask.front()); ++i) ::usleep(10'000);
  CHECK(affinity() == std::to_string(mask.front()));
  CHECK_FALSE(bound.let_go_if_shared());  // nobody else here
  CHECK(bound.claimed() == mask);
  {
    UnboundMark other(dir);
    REQUIRE(other.held());
    CHECK(bound.let_go_if_shared());
  }
  CHECK(affinity() == cpu_list(mask));
  // Whoever holds "shared" exclusively (anyone who may open it) cannot keep a job waiting.
  {
    const int fd = ::open((dir / "shared").c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX) == 0);
    UnboundMark blocked(dir);
    CHECK_FALSE(blocked.held());
    ::close(fd);
  }
  CHECK(bound.claimed().empty());
  CHECK(bound.let_go_if_shared());  // once let go, for good
  ::kill(rank, SIGKILL);
  ::waitpid(rank, nullptr, 0);
}

TEST_CASE("bound by request (--bind): stays bound when another job runs unbound") {
  using idist::launchers::CpuClaims;
  using idist::launchers::HeldBinding;
  TempDir tmp;
  const auto dir = tmp.path / "claims";
  const auto mask = idist::launchers::usable_cpus();
  CpuClaims claims;
  claims.claim_free(mask, dir);
  HeldBinding bound(HeldBinding::Role::bound_by_request, std::move(claims), mask, dir);
  idist::launchers::UnboundMark other(dir);
  REQUIRE(other.held());
  CHECK_FALSE(bound.let_go_if_shared());
  CHECK(bound.claimed() == mask);
}

TEST_CASE("the ranks' waits yield where the job's ranks on the machine outnumber its cores, not for other jobs") {
  using idist::detail::cpus_shared;
  using idist::detail::follow_cpus_shared;
  const int cores = idist::common::host_cores();
  idist::env::Contract contract;
  follow_cpus_shared(contract, cores);
  CHECK_FALSE(cpus_shared());
  follow_cpus_shared(contract, cores + 1);  // fake hosts of one job on this machine
  CHECK(cpus_shared());
  contract.cpus_shared = "0";  // the user's word wins
  follow_cpus_shared(contract, cores + 1);
  CHECK_FALSE(cpus_shared());
  idist::env::Contract forced;
  forced.cpus_shared = "1";
  follow_cpus_shared(forced);
  CHECK(cpus_shared());
  // More ranks on the host than cores (LOCAL_WORLD_SIZE): shared, before any join counts them.
  idist::env::Contract crowded;
  crowded.local_world_size = crowded.world_size = 4 * cores;
  follow_cpus_shared(crowded);
  CHECK(cpus_shared());
  follow_cpus_shared(idist::env::Contract{});
  CHECK_FALSE(cpus_shared());
}

