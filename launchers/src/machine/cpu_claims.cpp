#include "idist/launchers/cpu_claims.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <string>

#include "idist/launchers/resources.hpp"
#include "parse_whole.hpp"
#include "supervise/process_tree.hpp"

namespace idist::launchers {
namespace {

// DIR, made where missing (sticky and writable by all, as /tmp: every user's jobs share the
// machine's cpus); false where it is not a directory owned by root or us (a link or directory
// another user planted in /run/lock is not used) or cannot be made.
bool usable(const std::filesystem::path& dir) {
  if (::mkdir(dir.c_str(), 01777) == 0) ::chmod(dir.c_str(), 01777);  // past the umask
  struct stat st {};
  return ::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && (st.st_uid == 0 || st.st_uid == ::geteuid());
}

// DIR/NAME opened for its lock: read-only (enough for flock, so another user's file serves
// too), never blocking (a FIFO planted there would hold open(2) forever) and only a regular
// file. Where `create`, made where missing: O_CREAT on a file another user owns in a sticky
// directory fails under fs.protected_regular, so it is asked only when the file is not there.
// -1 where it cannot be opened.
int open_lock(const std::filesystem::path& dir, const std::string& name, bool create) {
  const auto file = dir / name;
  constexpr int kFlags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
  int fd = ::open(file.c_str(), kFlags);
  if (fd < 0 && errno == ENOENT && create) {
    fd = ::open(file.c_str(), kFlags | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) ::fchmod(fd, 0644);  // past the umask, so that other users can open it
    else if (errno == EEXIST) fd = ::open(file.c_str(), kFlags);  // another job made it meanwhile
  }
  struct stat st {};
  if (fd >= 0 && (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
    ::close(fd);
    fd = -1;
  }
  return fd;
}

std::string cpu_file(int cpu) { return "cpu" + std::to_string(cpu); }
constexpr const char* kSharedFile = "shared";

// flock(fd, op | LOCK_NB), tried `tries` times `gap` apart while another holds a conflicting
// lock: others' looks hold theirs for an instant, and a lock still there after a few tries is
// someone's. Never a blocking lock, which anyone able to open the file could keep us waiting
// on. Returns 0, or the last errno (EWOULDBLOCK: held by another).
int lock_within(int fd, int op, int tries, std::chrono::microseconds gap) {
  int why = 0;
  for (int attempt = 0; attempt < tries; ++attempt) {
    if (attempt > 0) ::usleep(static_cast<useconds_t>(gap.count()));
    if (::flock(fd, op | LOCK_NB) == 0) return 0;
    why = errno;
    if (why != EWOULDBLOCK) break;  // a file system without flock
  }
  return why;
}

// Whether someone holds an exclusive lock on DIR/NAME (a claim), asked once: a shared look
// meets only a claim (another's, or one being taken), never another look.
bool claimed_by_another(const std::filesystem::path& dir, const std::string& name) {
  const int fd = open_lock(dir, name, false);
  if (fd < 0) return false;  // no file: nobody ever held it
  const bool held = lock_within(fd, LOCK_SH, 1, std::chrono::milliseconds(0)) == EWOULDBLOCK;
  ::close(fd);  // lets go of the lock just taken, if it was
  return held;
}

}  // namespace

std::filesystem::path cpu_claims_dir(const env::Lookup& env) {
  if (const auto dir = env(kCpuClaimsVar); dir && !dir->empty()) return *dir;
  return "/run/lock/idist-cpu-claims";
}

std::vector<int> claimed_cpus(const std::vector<int>& cpus, const std::filesystem::path& dir) {
  std::vector<int> claimed;
  for (const int cpu : cpus)
    if (claimed_by_another(dir, cpu_file(cpu))) claimed.push_back(cpu);
  return claimed;
}

CpuClaims& CpuClaims::operator=(CpuClaims&& other) noexcept {
  if (this != &other) {
    release();
    held_ = std::exchange(other.held_, {});
  }
  return *this;
}

bool CpuClaims::claim_all(const std::vector<int>& cpus, const std::filesystem::path& dir) {
  release();
  if (!usable(dir)) return true;
  for (const int cpu : cpus)
    if (take(cpu, dir) == Taken::by_another) {
      release();
      return false;
    }
  return true;
}

void CpuClaims::claim_free(const std::vector<int>& cpus, const std::filesystem::path& dir) {
  release();
  if (!usable(dir)) return;
  for (const int cpu : cpus) take(cpu, dir);
}

CpuClaims::Taken CpuClaims::take(int cpu, const std::filesystem::path& dir) {
  if (std::any_of(held_.begin(), held_.end(), [&](const auto& h) { return h.first == cpu; })) return Taken::by_us;
  const int fd = open_lock(dir, cpu_file(cpu), true);
  if (fd < 0) return Taken::unusable;  // a file we may not open: the other cpus are still claimed
  // Another job's look (claimed_cpus) holds a shared lock for an instant.
  const int why = lock_within(fd, LOCK_EX, 3, std::chrono::milliseconds(2));
  if (why == 0) {
    held_.emplace_back(cpu, fd);
    return Taken::by_us;
  }
  ::close(fd);
  return why == EWOULDBLOCK ? Taken::by_another : Taken::unusable;  // no flock there: no claim
}

std::vector<int> CpuClaims::cpus() const {
  std::vector<int> out;
  for (const auto& h : held_) out.push_back(h.first);
  std::sort(out.begin(), out.end());
  return out;
}

void CpuClaims::release() {
  for (const auto& h : held_) ::close(h.second);
  held_.clear();
}

UnboundMark::UnboundMark(const std::filesystem::path& dir) {
  if (!usable(dir)) return;
  fd_ = open_lock(dir, kSharedFile, true);
  if (fd_ < 0) return;
  // A bound job's look (others_run_unbound) holds it exclusively for an instant.
  if (lock_within(fd_, LOCK_SH, 100, std::chrono::milliseconds(1)) == 0) return;
  ::close(fd_);
  fd_ = -1;
}

UnboundMark::~UnboundMark() {
  if (fd_ >= 0) ::close(fd_);
}

// Our exclusive look fails on a mark, but also on another bound job's look, held for an
// instant, or for longer where its holder is preempted on a busy machine (which would make a
// bound job let go for nothing). A shared lock tells them apart: it passes a mark, not a look.
// So a look that fails counts only where a shared lock then passes; three such, 2 ms apart,
// are an answer, and a moment with nobody holding the file proves no mark is there.
bool others_run_unbound(const std::filesystem::path& dir) {
  const int fd = open_lock(dir, kSharedFile, false);
  if (fd < 0) return false;  // no file: nobody ever ran unbound
  int marks = 0;
  for (int attempt = 0; attempt < 100 && marks < 3; ++attempt) {
    if (attempt > 0) ::usleep(2000);
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 || errno != EWOULDBLOCK) break;
    if (::flock(fd, LOCK_SH | LOCK_NB) == 0) {
      ++marks;
      ::flock(fd, LOCK_UN);
    } else if (errno != EWOULDBLOCK) {
      break;
    }
  }
  ::close(fd);
  return marks >= 3;
}

std::size_t rebind_tree(pid_t root, const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int cpu : cpus)
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
  std::size_t reached = 0;
  for (int pass = 0; pass < 2; ++pass) {
    reached = 0;
    for (const pid_t pid : detail::descendants_of(root)) {
      // A process or thread gone meanwhile: nothing to do (error codes, never exceptions).
      std::error_code ec;
      std::filesystem::directory_iterator task("/proc/" + std::to_string(pid) + "/task", ec);
      if (ec) continue;
      ++reached;
      for (; task != std::filesystem::directory_iterator(); task.increment(ec)) {
        if (const auto tid = parse_whole<pid_t>(task->path().filename().string()))
          ::sched_setaffinity(*tid, sizeof(set), &set);
        if (ec) break;
      }
    }
  }
  return reached;
}

HeldBinding::HeldBinding(Role role, CpuClaims claims, std::vector<int> mask, std::filesystem::path dir)
    : role_(role), claims_(std::move(claims)), mask_(std::move(mask)), dir_(std::move(dir)) {
  if (role_ == Role::unbound_for_want || role_ == Role::bound_over_claims) mark_.emplace(dir_);
}

HeldBinding::~HeldBinding() {
  stop_ = true;
  if (watcher_.joinable()) watcher_.join();
}

std::vector<int> HeldBinding::claimed() const {
  const std::lock_guard lock(mu_);
  return claims_.cpus();
}

bool HeldBinding::let_go_if_shared() {
  const std::lock_guard lock(mu_);
  if (let_go_ || role_ != Role::bound_by_default) return let_go_;
  if (!others_run_unbound(dir_)) return false;
  const auto reached = rebind_tree(::getpid(), mask_);
  claims_.release();
  let_go_ = true;
  note_ = fmt::format("another idist-run job here runs unbound for want of free cpus: ours unbound too ({} "
                      "process(es) then running, now on cpus {}), so that the scheduler places both jobs' ranks",
                      reached, cpu_list(mask_));
  return true;
}

std::string HeldBinding::take_note() {
  const std::lock_guard lock(mu_);
  return std::exchange(note_, {});
}

void HeldBinding::watch() {
  // Nothing claimed (no usable directory): nobody can ask us to let go.
  if (role_ != Role::bound_by_default || watcher_.joinable() || claimed().empty()) return;
  watcher_ = std::thread([this] {
    auto nap = [this](std::chrono::milliseconds total) {
      for (auto slept = std::chrono::milliseconds(0); slept < total && !stop_; slept += std::chrono::milliseconds(10))
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    };
    // Nothing thrown may leave the thread (std::terminate would end the job): a failed look
    // only leaves the ranks as they are.
    try {
      while (!stop_ && !let_go_if_shared()) nap(std::chrono::milliseconds(200));
      nap(std::chrono::seconds(1));
      if (!stop_) rebind_tree(::getpid(), mask_);
    } catch (...) {
    }
  });
}

}  // namespace idist::launchers
