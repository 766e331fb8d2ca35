#pragma once
// Claims on cpus between idist-run jobs on one machine. Each job alone sees the whole machine,
// as mpirun does, so two that bind their ranks by default pin them onto the same first cpus;
// and where the machine has more ranks than cpus, a pinned rank cannot move to a cpu another
// has left. Two fake hosts of 2 ranks each on 2 cpus, all_reduce from 64 B to 2 MiB: both
// bound 1.5-2.5x the time of both unbound, one bound and one not about the same
// (docs/BENCHMARKS.md). So, in a directory DIR that every job of the machine sees:
//   cpuN    a job whose ranks are bound holds an exclusive flock(2) on it for each cpu they are
//           bound to; a later job's default binding leaves those cpus out;
//   shared  a job left with fewer free cpus than ranks runs unbound and holds a shared flock
//           on it while it runs; a job bound by default that sees it held unbinds its ranks
//           and lets go of its cpus: everybody then runs as with --no-bind.
// The kernel drops a lock however its holder ends: no claim outlives its job. DIR is
// IDIST_CPU_CLAIMS, else /run/lock/idist-cpu-claims (the place for lock files: a tmpfs,
// writable by all, never cleaned by age as /tmp is; one per machine or container). Where DIR
// cannot be made or opened, nothing is claimed and nothing is seen: binding is then as if no
// other job ran.

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "idist/env_contract.hpp"

namespace idist::launchers {

inline constexpr std::string_view kCpuClaimsVar = "IDIST_CPU_CLAIMS";
std::filesystem::path cpu_claims_dir(const env::Lookup& env = env::process_env());

// Of `cpus`, those that another process (or another claim of this one) holds now.
std::vector<int> claimed_cpus(const std::vector<int>& cpus, const std::filesystem::path& dir);

// Claims held while the object lives (the descriptors are close-on-exec: ranks do not hold
// their launcher's claims).
class CpuClaims {
 public:
  CpuClaims() = default;
  CpuClaims(CpuClaims&& other) noexcept : held_(std::exchange(other.held_, {})) {}
  CpuClaims& operator=(CpuClaims&& other) noexcept;
  CpuClaims(const CpuClaims&) = delete;
  CpuClaims& operator=(const CpuClaims&) = delete;
  ~CpuClaims() { release(); }

  // Every cpu of `cpus`, or none: false where another process holds one of them. True, with
  // nothing claimed, where `dir` cannot be used.
  bool claim_all(const std::vector<int>& cpus, const std::filesystem::path& dir);
  // Those of `cpus` that nobody holds.
  void claim_free(const std::vector<int>& cpus, const std::filesystem::path& dir);
  std::vector<int> cpus() const;
  void release();

 private:
  enum class Taken { by_us, by_another, unusable };
  Taken take(int cpu, const std::filesystem::path& dir);
  std::vector<std::pair<int, int>> held_;  // cpu, descriptor holding its lock
};

// DIR/shared held (shared lock) while the object lives: this job runs unbound for want of
// free cpus, and asks the bound ones to let go.
class UnboundMark {
 public:
  explicit UnboundMark(const std::filesystem::path& dir);
  UnboundMark(const UnboundMark&) = delete;
  UnboundMark& operator=(const UnboundMark&) = delete;
  ~UnboundMark();
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Whether another job holds an UnboundMark in `dir` now.
bool others_run_unbound(const std::filesystem::path& dir);

// Sets the affinity of every thread of every process below `root` to `cpus` (twice over, for
// threads started meanwhile); returns how many processes it reached.
std::size_t rebind_tree(pid_t root, const std::vector<int>& cpus);

// A spawning job's binding among the other jobs of the machine, for as long as it lives. Its
// ranks' waits do not follow it: they spin beside another job's ranks, as Open MPI's do, and
// yield only where the job's own ranks outnumber the cores (the library's cpus_shared.hpp).
class HeldBinding {
 public:
  enum class Role {
    bound_by_default,   // holds its cpus; lets go when another job runs unbound for want of them
                        // (its ranks then run unbound for good)
    bound_by_request,   // --bind, every cpu claimed: never lets go
    bound_over_claims,  // --bind onto cpus another job claimed: holds an UnboundMark, so that
                        // jobs bound by default let go
    unbound_for_want,   // too few cpus left free by others' claims (default binding, or
                        // --no-bind): holds an UnboundMark
    unbound,            // --no-bind, or nobody else's claims in the way: nothing to hold
  };
  HeldBinding(Role role, CpuClaims claims, std::vector<int> mask, std::filesystem::path dir);
  HeldBinding(const HeldBinding&) = delete;
  HeldBinding& operator=(const HeldBinding&) = delete;
  ~HeldBinding();
  // Bound by default, where another job here runs unbound for want of cpus: rebinds every
  // process below us to the whole mask, lets go of the cpus and leaves a note (take_note).
  // Returns whether it has let go, now or before: an attempt about to spawn its ranks spawns
  // them unbound then.
  bool let_go_if_shared();
  // The line that says it let go, once (empty otherwise): for the caller to log from a thread
  // that may write to the console, which the watcher may not.
  std::string take_note();
  // The same every 200 ms from now on, on a thread of its own (call once the supervisor has
  // forked what it forks): let_go_if_shared until it lets go, then one more pass a second later
  // for ranks an attempt was spawning meanwhile. Idempotent.
  void watch();
  Role role() const { return role_; }
  std::vector<int> claimed() const;  // the cpus it holds now
  bool marked() const { return mark_ && mark_->held(); }  // holds an UnboundMark

 private:
  Role role_;
  CpuClaims claims_;
  std::vector<int> mask_;
  std::filesystem::path dir_;
  std::optional<UnboundMark> mark_;
  mutable std::mutex mu_;  // let_go_if_shared from the attempt's thread and the watcher
  bool let_go_ = false;
  std::string note_;
  std::atomic<bool> stop_{false};
  std::thread watcher_;  // joined by the destructor, before any member goes
};

}  // namespace idist::launchers
