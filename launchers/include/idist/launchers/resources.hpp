#pragma once
// What this node offers the ranks idist-run spawns: GPUs for `-n auto`, and the cores (by NUMA
// node) that `--bind` shares out. Read from the kernel (/proc, /sys, the affinity mask), never
// from CUDA: idist-run links no GPU library and must work where there is none.

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "idist/env_contract.hpp"

namespace idist::launchers {

// The GPUs a rank here may use. `driver_dir` lists one entry per NVIDIA GPU the driver sees
// (/proc/driver/nvidia/gpus); CUDA_VISIBLE_DEVICES narrows them as CUDA does: its entries up
// to the first that names no device ("-1", an index past the last GPU), UUIDs counted as
// given; set but empty means none.
struct GpuCount {
  int count = 0;
  std::string why;  // for -v: "2 GPUs (CUDA_VISIBLE_DEVICES=0,1)", "no GPU (no NVIDIA driver)"
};
GpuCount visible_gpus(const env::Lookup& env = env::process_env(),
                      const std::filesystem::path& driver_dir = "/proc/driver/nvidia/gpus");

// The cores this process may run on (its affinity mask, so a cgroup or an outer launcher's
// binding is respected), in increasing order.
std::vector<int> usable_cpus();

// The cpus processes here are given before anyone binds them: the cpuset of our cgroup (a
// container's or a SLURM job's allotment) where the kernel says one, else the online cpus.
// idist-run's own affinity mask narrower than this means the user or an outer launcher bound
// it (taskset, numactl, srun --cpu-bind, mpirun --bind-to): the one signal every way of binding
// leaves, where a launcher's variables (SLURM_CPU_BIND, OMPI_MCA_hwloc_base_binding_policy)
// may be inherited, or say "none", without any mask being set.
struct CpuAllotment {
  std::vector<int> cpus;  // increasing; empty: the kernel said nothing readable
  std::string source;     // for -v and --dry-run: "cgroup cpuset 0-7", "online cpus 0-63"
};
CpuAllotment allotted_cpus(const std::filesystem::path& proc_cgroup = "/proc/self/cgroup",
                           const std::filesystem::path& cgroup_root = "/sys/fs/cgroup",
                           const std::filesystem::path& online = "/sys/devices/system/cpu/online");

// CPU -> its physical core (package and core id in one number), from `cpu_dir`
// (/sys/devices/system/cpu/cpuN/topology); empty when the machine says nothing.
std::map<int, int> core_of_cpu(const std::filesystem::path& cpu_dir = "/sys/devices/system/cpu");

// CPU -> NUMA node, from `node_dir` (/sys/devices/system/node); empty when the machine says nothing.
std::map<int, int> numa_node_of_cpu(const std::filesystem::path& node_dir = "/sys/devices/system/node");

// `cpus` shared out among `ranks` local ranks for binding: cpus ordered by (NUMA node,
// physical core, id) and cut into contiguous shares whose sizes differ by one at most, so that a
// share stays within one NUMA node whenever the counts allow and two ranks share no core's
// hyperthreads when each has whole cores. With more ranks than cpus, rank i gets cpu i mod n.
std::vector<std::vector<int>> cpu_shares(const std::vector<int>& cpus, int ranks, const std::map<int, int>& numa = {},
                                         const std::map<int, int>& core = {});

// "0-3,8": a share as taskset and /proc/PID/status write it.
std::string cpu_list(const std::vector<int>& cpus);

}  // namespace idist::launchers
