#include "oom.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <vector>

namespace idist::launchers::supervision {

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return in ? text.str() : std::string();
}

// Our memory cgroup's file that counts OOM kills: v2 ("0::/path") or v1 ("N:memory:/path").
// The ranks are in it unless something moved them.
std::string counter_path() {
  std::ifstream cgroups("/proc/self/cgroup");
  std::string line, v1, v2;
  while (std::getline(cgroups, line)) {
    const auto first = line.find(':');
    const auto second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (line.starts_with("0::")) v2 = path;
    std::stringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');)
      if (c == "memory") v1 = path;
  }
  std::vector<std::string> candidates;
  if (!v2.empty()) {
    candidates.push_back("/sys/fs/cgroup" + v2 + "/memory.events");
    candidates.push_back("/sys/fs/cgroup/unified" + v2 + "/memory.events");
  }
  if (!v1.empty()) candidates.push_back("/sys/fs/cgroup/memory" + v1 + "/memory.oom_control");
  for (const auto& candidate : candidates)
    if (oom_kill_count(slurp(candidate))) return candidate;
  return "";
}

}  // namespace

std::optional<std::uint64_t> oom_kill_count(const std::string& text) {
  std::istringstream in(text);
  std::string key;
  std::uint64_t value = 0;
  while (in >> key >> value)
    if (key == "oom_kill") return value;
  return std::nullopt;
}

OomWatch::OomWatch() : path_(counter_path()) {
  if (auto n = read()) seen_ = *n;
  spdlog::debug("OOM kills counted in {}", path_.empty() ? std::string("(no memory cgroup file)") : path_);
}

std::optional<std::uint64_t> OomWatch::read() const {
  if (path_.empty()) return std::nullopt;
  return oom_kill_count(slurp(path_));
}

void OomWatch::explain(detail::RankRecord& rank) {
  if (!rank.status || !WIFSIGNALED(*rank.status) || WTERMSIG(*rank.status) != SIGKILL) return;
  const auto now = read();
  if (!now || *now <= seen_) return;
  seen_ = *now;
  rank.oom_killed = true;
}

}  // namespace idist::launchers::supervision
