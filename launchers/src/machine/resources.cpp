#include "idist/launchers/resources.hpp"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <tuple>
#include <system_error>

#include "parse_whole.hpp"

namespace idist::launchers {
namespace {

// "0-3,8,10-11" (the kernel's cpulist format) -> {0,1,2,3,8,10,11}; malformed parts are skipped.
std::vector<int> parse_cpulist(const std::string& text) {
  std::vector<int> cpus;
  std::size_t start = 0;
  while (start < text.size()) {
    auto end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string_view part(text.data() + start, end - start);
    const auto dash = part.find('-');
    const auto lo = parse_whole<int>(part.substr(0, dash));
    const auto hi = dash == std::string_view::npos ? lo : parse_whole<int>(part.substr(dash + 1));
    if (lo && hi)
      for (int c = *lo; c <= *hi && c - *lo < (1 << 16); ++c) cpus.push_back(c);
    start = end + 1;
  }
  return cpus;
}

std::vector<int> read_cpulist(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string list;
  if (!in || !std::getline(in, list)) return {};
  auto cpus = parse_cpulist(list);
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::optional<int> read_int(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string text;
  if (!in || !std::getline(in, text)) return std::nullopt;
  return parse_whole<int>(text);
}

}  // namespace

CpuAllotment allotted_cpus(const std::filesystem::path& proc_cgroup, const std::filesystem::path& cgroup_root,
                           const std::filesystem::path& online) {
  // /proc/self/cgroup: "N:cpuset:/path" under cgroup v1, "0::/path" under v2 (whose cpuset
  // file exists only where the cpuset controller is on).
  std::ifstream in(proc_cgroup);
  for (std::string line; std::getline(in, line);) {
    const auto first = line.find(':');
    const auto second = first == std::string::npos ? std::string::npos : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    const std::string relative = path.starts_with("/") ? path.substr(1) : path;
    std::vector<std::filesystem::path> files;
    if (controllers == "cpuset") {
      files = {cgroup_root / "cpuset" / relative / "cpuset.effective_cpus", cgroup_root / "cpuset" / relative / "cpuset.cpus"};
    } else if (controllers.empty() && line.starts_with("0:")) {
      files = {cgroup_root / relative / "cpuset.cpus.effective", cgroup_root / "unified" / relative / "cpuset.cpus.effective"};
    }
    for (const auto& file : files)
      if (auto cpus = read_cpulist(file); !cpus.empty()) return {cpus, "cgroup cpuset " + cpu_list(cpus)};
  }
  auto cpus = read_cpulist(online);
  if (cpus.empty()) return {};
  return {cpus, "online cpus " + cpu_list(cpus)};
}

std::map<int, int> core_of_cpu(const std::filesystem::path& cpu_dir) {
  std::map<int, int> core;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(cpu_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with("cpu")) continue;
    const auto cpu = parse_whole<int>(std::string_view(name).substr(3));
    if (!cpu) continue;
    const auto package = read_int(it->path() / "topology" / "physical_package_id");
    const auto id = read_int(it->path() / "topology" / "core_id");
    if (package && id) core[*cpu] = (std::max(*package, 0) << 16) + std::max(*id, 0);
  }
  return core;
}

GpuCount visible_gpus(const env::Lookup& env, const std::filesystem::path& driver_dir) {
  std::error_code ec;
  int physical = 0;
  for (std::filesystem::directory_iterator it(driver_dir, ec), end; !ec && it != end; it.increment(ec)) ++physical;
  if (physical == 0) return {0, "no GPU (no NVIDIA driver lists one)"};
  const auto visible = env("CUDA_VISIBLE_DEVICES");
  if (!visible) return {physical, std::to_string(physical) + " GPU(s) (the driver's; CUDA_VISIBLE_DEVICES unset)"};
  int count = 0;
  std::string_view rest = *visible;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const auto entry = rest.substr(0, comma);
    // CUDA stops at the first entry that names no device.
    if (const auto index = parse_whole<int>(entry)) {
      if (*index < 0 || *index >= physical) break;
    } else if (!entry.starts_with("GPU-") && !entry.starts_with("MIG-")) {
      break;
    }
    ++count;
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return {count, std::to_string(count) + " GPU(s) (CUDA_VISIBLE_DEVICES=" + *visible + ")"};
}

std::vector<int> usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

std::map<int, int> numa_node_of_cpu(const std::filesystem::path& node_dir) {
  std::map<int, int> numa;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(node_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with("node")) continue;
    const auto node = parse_whole<int>(std::string_view(name).substr(4));
    std::ifstream in(it->path() / "cpulist");
    std::string list;
    if (!node || !std::getline(in, list)) continue;
    for (const int cpu : parse_cpulist(list)) numa[cpu] = *node;
  }
  return numa;
}

std::vector<std::vector<int>> cpu_shares(const std::vector<int>& cpus, int ranks, const std::map<int, int>& numa,
                                         const std::map<int, int>& core) {
  std::vector<std::vector<int>> shares(static_cast<std::size_t>(std::max(ranks, 0)));
  if (cpus.empty() || ranks <= 0) return shares;
  std::vector<int> ordered = cpus;
  const auto node_of = [&](int cpu) {
    const auto it = numa.find(cpu);
    return it == numa.end() ? 0 : it->second;
  };
  // A cpu the machine gives no core for counts as a core of its own, after the known ones.
  const auto core_of = [&](int cpu) {
    const auto it = core.find(cpu);
    return it == core.end() ? (1 << 30) + cpu : it->second;
  };
  std::stable_sort(ordered.begin(), ordered.end(), [&](int a, int b) {
    return std::tuple(node_of(a), core_of(a), a) < std::tuple(node_of(b), core_of(b), b);
  });
  const auto n = ordered.size();
  const auto r = static_cast<std::size_t>(ranks);
  if (r >= n) {
    for (std::size_t i = 0; i < r; ++i) shares[i] = {ordered[i % n]};
    return shares;
  }
  // The first n % r shares get one cpu more.
  std::size_t next = 0;
  for (std::size_t i = 0; i < r; ++i) {
    const std::size_t size = n / r + (i < n % r ? 1 : 0);
    shares[i].assign(ordered.begin() + static_cast<std::ptrdiff_t>(next),
                     ordered.begin() + static_cast<std::ptrdiff_t>(next + size));
    next += size;
  }
  return shares;
}

std::string cpu_list(const std::vector<int>& cpus) {
  std::vector<int> sorted = cpus;
  std::sort(sorted.begin(), sorted.end());
  std::string out;
  for (std::size_t i = 0; i < sorted.size();) {
    std::size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(sorted[i]);
    if (j > i) out += "-" + std::to_string(sorted[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace idist::launchers
