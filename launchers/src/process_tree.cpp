#include "process_tree.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

namespace idist::launchers::detail {
namespace {

// The parent of `pid` from /proc/PID/stat, or -1 if it is gone. The command name (field 2)
// may hold spaces and parentheses, so the fields are read after its last ')'.
pid_t parent_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return -1;
  const auto close = stat.rfind(')');
  if (close == std::string::npos || close + 4 >= stat.size()) return -1;
  // ") S PPID ..."
  return static_cast<pid_t>(std::strtol(stat.c_str() + close + 4, nullptr, 10));
}

}  // namespace

bool become_subreaper() { return ::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0; }

std::vector<pid_t> descendants_of(pid_t root) {
  std::multimap<pid_t, pid_t> children;
  if (DIR* dir = ::opendir("/proc")) {
    while (const dirent* entry = ::readdir(dir)) {
      char* end = nullptr;
      const long pid = std::strtol(entry->d_name, &end, 10);
      if (end == entry->d_name || *end != '\0') continue;
      const pid_t parent = parent_of(static_cast<pid_t>(pid));
      if (parent > 0) children.emplace(parent, static_cast<pid_t>(pid));
    }
    ::closedir(dir);
  }
  std::vector<pid_t> found;
  std::vector<pid_t> todo{root};
  while (!todo.empty()) {
    const pid_t parent = todo.back();
    todo.pop_back();
    const auto [first, last] = children.equal_range(parent);
    for (auto it = first; it != last; ++it) {
      found.push_back(it->second);
      todo.push_back(it->second);
    }
  }
  return found;
}

std::size_t signal_descendants(int sig) {
  const auto pids = descendants_of(::getpid());
  for (const pid_t pid : pids) ::kill(pid, sig);
  return pids.size();
}

}  // namespace idist::launchers::detail
