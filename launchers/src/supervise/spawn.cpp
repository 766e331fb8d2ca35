#include "spawn.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <system_error>
#include <vector>

#include "idist/launchers/program.hpp"
#include "output/console.hpp"
#include "process_tree.hpp"

namespace idist::launchers::detail {
namespace {

[[noreturn]] void fail(const char* what) { throw std::system_error(errno, std::generic_category(), what); }

void close_all(std::initializer_list<int> fds) {
  const int saved = errno;
  for (const int fd : fds)
    if (fd >= 0) ::close(fd);
  errno = saved;
}

// Closes what an exec would have of the supervisor's: every close-on-exec descriptor (its
// pipes and event loop, the guardian's pipe, a reserved port) but the caller's own, which the
// entry may use. A forked rank holding the guardian's pipe would keep it from ever acting.
void close_as_exec_would(const std::vector<int>& keep) {
  std::vector<int> fds;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (const dirent* entry = ::readdir(dir)) {
      const int fd = std::atoi(entry->d_name);
      if (entry->d_name[0] != '.' && fd > STDERR_FILENO && fd != ::dirfd(dir)) fds.push_back(fd);
    }
    ::closedir(dir);
  }
  for (const int fd : fds)
    if (const int flags = ::fcntl(fd, F_GETFD);
        flags >= 0 && (flags & FD_CLOEXEC) != 0 && std::find(keep.begin(), keep.end(), fd) == keep.end())
      ::close(fd);
}

// The child of a rank with an entry (ProcessSpec::entry), after the common set-up. The caller
// was single-threaded at fork, so this copy of it may allocate and use stdio.
[[noreturn]] void run_entry(const ProcessSpec& spec) {
  close_as_exec_would(spec.inherited_fds);
  attach_log(nullptr);  // our messages: straight to stderr, not to the parent's console queue
  ::clearenv();
  for (const auto& e : spec.env) ::putenv(const_cast<char*>(e.c_str()));
  ::putenv(const_cast<char*>(supervisor_marker().c_str()));
  // stdout is now a pipe: line-buffered, as `python3 -u` is for torchrun, so that lines
  // reach the console as they are written and are not lost to a signal.
  ::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
  int code = 1;
  try {
    code = spec.entry();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: uncaught exception: %s\n", spec.rank, e.what());
  } catch (...) {
    std::fprintf(stderr, "rank %d: uncaught exception (not a std::exception)\n", spec.rank);
  }
  // std::cout & co. buffer apart from stdio when the program turned sync_with_stdio off.
  std::cout.flush();
  std::cerr.flush();
  std::clog.flush();
  std::fflush(nullptr);
  // Not exit(): the static objects and atexit handlers are the parent's, which goes on.
  ::_exit(code);
}

}  // namespace

SpawnedRank spawn_rank(const ProcessSpec& spec) {
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(const_cast<char*>(supervisor_marker().c_str()));  // what the guardian looks for
  envp.push_back(nullptr);
  // The child may only make system calls: the likely reasons are put into words here.
  const std::string exec_error = "idist-run: rank " + std::to_string(spec.rank) + ": cannot execute " + spec.path + ": ";
  const auto missing = exec_failure(spec.path, ENOENT), no_format = exec_failure(spec.path, ENOEXEC);

  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0) fail("pipe");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    close_all({out[0], out[1]});
    fail("pipe");
  }
  // stdin goes to rank 0 when it is a file or pipe (as mpirun does); a terminal is not
  // shared, because ranks run in background process groups and would stop on SIGTTIN.
  const bool give_stdin = spec.rank == 0 && !::isatty(STDIN_FILENO);
  const int devnull = give_stdin ? -1 : ::open("/dev/null", O_RDONLY | O_CLOEXEC);

  cpu_set_t cpus;  // built here: the child may only make system calls
  CPU_ZERO(&cpus);
  for (const int cpu : spec.cpus)
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &cpus);

  // Block signals across fork so that no handler of ours runs in the child.
  sigset_t all, previous;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &previous);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Child: only async-signal-safe calls from here to exec (or to run_entry, whose caller
    // had no other thread).
    for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // idist-run died before the prctl took hold
    if (!spec.cpus.empty()) ::sched_setaffinity(0, sizeof(cpus), &cpus);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    for (const int fd : spec.pass_fds) ::fcntl(fd, F_SETFD, 0);
    if (spec.entry) run_entry(spec);
    ::execve(spec.path.c_str(), argv.data(), envp.data());
    const int err = errno;
    const char* why = err == ENOENT ? missing.why.c_str() : err == ENOEXEC ? no_format.why.c_str() : ::strerror(err);
    [[maybe_unused]] auto a = ::write(STDERR_FILENO, exec_error.data(), exec_error.size());
    [[maybe_unused]] auto b = ::write(STDERR_FILENO, why, std::strlen(why));
    [[maybe_unused]] auto c = ::write(STDERR_FILENO, "\n", 1);
    ::_exit(err == ENOENT ? missing.code : kCannotExecute);
  }
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  close_all({out[1], err[1], devnull});
  if (pid < 0) {
    close_all({out[0], err[0]});
    errno = fork_errno;
    fail("fork");
  }
  ::setpgid(pid, pid);  // also in the parent, so that it holds before we ever signal the group
  return {pid, out[0], err[0]};
}

int memfd_for_ranks(const char* name, std::size_t bytes) {
  int fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd >= 0 && fd <= STDERR_FILENO) {
    const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
    ::close(fd);
    fd = moved;
  }
  if (fd < 0) return -1;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace idist::launchers::detail
