#include "process_tree.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>

namespace idist::launchers::detail {

std::vector<std::string> proc_stat_fields(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::vector<std::string> fields;
  if (!std::getline(in, stat)) return fields;
  const auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return fields;
  std::istringstream rest(stat.substr(close + 2));
  for (std::string f; rest >> f;) fields.push_back(std::move(f));
  return fields;
}

namespace {

// The parent of `pid`, or -1 if it is gone.
pid_t parent_of(pid_t pid) {
  const auto f = proc_stat_fields(pid);
  return f.size() > 1 ? static_cast<pid_t>(std::strtol(f[1].c_str(), nullptr, 10)) : -1;
}

}  // namespace

bool is_exiting(pid_t pid) {
  const auto f = proc_stat_fields(pid);  // state, ppid, pgrp, session, tty_nr, tpgid, flags, ...
  if (f.size() < 7) return false;
  if (f[0] == "Z" || f[0] == "X") return true;
  constexpr unsigned long kPfExiting = 0x4;  // PF_EXITING, include/linux/sched.h
  return (std::strtoul(f[6].c_str(), nullptr, 10) & kPfExiting) != 0;
}

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

std::vector<pid_t> processes_with_env(const std::string& assignment) {
  std::vector<pid_t> found;
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return found;
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || pid == ::getpid()) continue;
    std::ifstream in(std::string("/proc/") + entry->d_name + "/environ", std::ios::binary);
    for (std::string var; std::getline(in, var, '\0');) {
      if (var == assignment) {
        found.push_back(static_cast<pid_t>(pid));
        break;
      }
    }
  }
  ::closedir(dir);
  return found;
}

const std::string& supervisor_marker() {
  static const std::string marker = [] {
    std::random_device random;
    return "IDIST_SUPERVISOR=" + std::to_string(::getpid()) + "-" + std::to_string(random());
  }();
  return marker;
}

void start_guardian() {
  // One per process: the marker is the process's, and a program that supervises several
  // jobs in turn (idist::spawn twice) needs no second one.
  static bool started = false;
  if (started) return;
  started = true;
  int fds[2];
  // Close-on-exec: only idist-run holds the write end, so its exit is the guardian's EOF.
  if (::pipe2(fds, O_CLOEXEC) != 0) return;
  const std::string wanted = supervisor_marker();
  const pid_t middle = ::fork();
  if (middle < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return;
  }
  if (middle == 0) {
    if (::fork() != 0) ::_exit(0);  // the guardian is re-parented away from idist-run
    ::setsid();                     // and a Ctrl-C on the terminal does not reach it
    ::prctl(PR_SET_NAME, "idist-guardian");
    // idist-run's signal handlers write to descriptors we close below: back to the defaults,
    // so that a TERM ends us like any process.
    for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    [[maybe_unused]] const int moved = ::chdir("/");  // nor keep idist-run's directory busy
    ::close(fds[1]);
    // Hold nothing of idist-run's open: not its console (a caller reading idist-run's output
    // to EOF must not wait for us), not its reserved port.
    ::dup2(fds[0], 3);
    if (::close_range(4, ~0U, 0) != 0) {  // kernels before 5.9, or a seccomp filter that refuses it
      const long limit = std::min(::sysconf(_SC_OPEN_MAX), 1L << 16);
      for (int fd = 4; fd < limit; ++fd) ::close(fd);
    }
    if (const int null = ::open("/dev/null", O_RDWR); null >= 0) {
      for (int fd = 0; fd <= 2; ++fd) ::dup2(null, fd);
      if (null > 3) ::close(null);
    }
    char byte;
    while (::read(3, &byte, 1) < 0 && errno == EINTR) {
    }
    // A helper may be mid-fork: scan until a round finds nothing (2 s at most).
    for (int round = 0; round < 40; ++round) {
      const auto pids = processes_with_env(wanted);
      if (pids.empty()) break;
      for (const pid_t pid : pids) ::kill(pid, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::_exit(0);
  }
  ::close(fds[0]);
  ::waitpid(middle, nullptr, 0);
  // fds[1] stays open, unused, for the rest of our life.
}

}  // namespace idist::launchers::detail
