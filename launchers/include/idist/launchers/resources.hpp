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

// CPU -> NUMA node, from `node_dir` (/sys/devices/system/node); empty when the machine says nothing.
std::map<int, int> numa_node_of_cpu(const std::filesystem::path& node_dir = "/sys/devices/system/node");

// `cpus` shared out among `ranks` local ranks for --bind: cpus ordered by (NUMA node, id) and
// cut into contiguous shares whose sizes differ by one at most, so that a share stays within
// one NUMA node whenever the counts allow. With more ranks than cpus, rank i gets cpu i mod n.
std::vector<std::vector<int>> cpu_shares(const std::vector<int>& cpus, int ranks, const std::map<int, int>& numa = {});

// "0-3,8": a share as taskset and /proc/PID/status write it.
std::string cpu_list(const std::vector<int>& cpus);

}  // namespace idist::launchers
