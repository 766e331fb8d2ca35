#pragma once
// ignite.distributed's entry points: idist::spawn and idist::Parallel. A program that uses them
// starts its own ranks when run plainly, and only initialises when a launcher already started
// them (idist-run, srun, mpirun, torchrun):
//
//   void all_reduce_example(int local_rank) { ... idist::all_reduce(tensor); ... }
//   int main() { idist::spawn(all_reduce_example, {.backend = "gloo", .nproc_per_node = 3}); }
//
//   ./all_reduce_spawn                  3 ranks, started by the program
//   idist-run -n 3 ./all_reduce_spawn   3 ranks, started by idist-run; each runs fn once
//   srun -n 3 ./all_reduce_spawn        the same from SLURM (mpirun -np 3 too)
//
// Ranks are forked, not re-executed: the calling process must have no other thread when it
// starts them (a fork copies the locks other threads hold, never released in the child).
// Forking lets fn and its arguments be anything, captures included, and code outside fn runs
// once, in the caller. Each rank is then a real process supervised as by idist-run (the
// launchers/ supervisor): its own process group, killed if the caller dies, output forwarded
// line by line, the first failure stopping the others. A rank leaves through _exit() after
// fn returns: the caller's static objects and atexit handlers are not run in it.
//
// Link idist::launch (it brings idist::idist).

#include <chrono>
#include <concepts>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "idist/idist.hpp"

namespace idist {

// As ignite's spawn takes them, plus the job's identity for several nodes.
struct SpawnOptions {
  std::string backend = "gloo";
  // Ranks on this host. spawn: 1 when unset. Under a launcher that already started this
  // process as one of several ranks, a value other than its ranks on this node is refused.
  std::optional<int> nproc_per_node{};
  std::optional<int> nnodes{};       // hosts in the job, each running spawn; 1 when unset
  std::optional<int> node_rank{};    // this host's index, 0 to nnodes - 1 (needed with nnodes > 1)
  std::string master_addr{};         // rank 0's host; needed with nnodes > 1 (default 127.0.0.1)
  std::optional<int> master_port{};  // rank 0's store; default: a free port here, or derived from rdzv_id
  // The job's identity, the same on every host and unique to the job (e.g. from
  // `openssl rand -hex 8`): only processes presenting it reach rank 0's store. Needed with
  // nnodes > 1 unless IDIST_JOB_TOKEN is exported.
  std::string rdzv_id{};
  std::optional<std::chrono::milliseconds> timeout{};  // rendezvous and collectives (IDIST_TIMEOUT; 300 s)
  bool recovery = false;  // InitOptions::recovery for each rank (idist::Recovery; idist-run -n N only)
};

// A spawned rank failed: it exited non-zero, was killed by a signal, or fn threw (exit code 1,
// the exception's message on its stderr). The others were stopped. rank() is the rank that
// failed; the message names it, how it ended, the ranks stopped, and its last stderr lines.
class IDIST_API SpawnError : public Error {
 public:
  SpawnError(ErrorSite site, const std::string& detail, std::optional<int> exit_code, std::optional<int> signal,
             std::vector<std::string> last_stderr)
      : Error(std::move(site), detail), exit_code_(exit_code), signal_(signal), last_stderr_(std::move(last_stderr)) {}
  std::optional<int> exit_code() const noexcept { return exit_code_; }  // set when it exited
  std::optional<int> signal() const noexcept { return signal_; }        // set when a signal killed it
  const std::vector<std::string>& last_stderr() const noexcept { return last_stderr_; }

 private:
  std::optional<int> exit_code_, signal_;
  std::vector<std::string> last_stderr_;
};

namespace detail {
IDIST_API void spawn(const std::function<void(int)>& fn, const SpawnOptions& options);
}

// Runs fn(local_rank, args...) (args as lvalues) on nproc_per_node ranks of this host, each initialised with
// options.backend and finalised after fn, and returns when every rank is done. Throws
// SpawnError when a rank fails, idist::Error for bad options or a broken environment.
// Under a launcher that already started this process as a rank (idist-run, srun, mpirun,
// torchrun), starts nothing: initialises, runs fn here once, finalises. Inside a SLURM or
// MPI task that is alone on its node, nproc_per_node ranks are started per task, as
// `srun -N2 --ntasks-per-node=1 idist-run -n K` would.
template <class Fn, class... Args>
void spawn(Fn&& fn, const SpawnOptions& options = {}, Args&&... args) {
  detail::spawn([&](int local_rank) { std::invoke(fn, local_rank, args...); }, options);
}

// ignite's Parallel: `idist::Parallel parallel({.backend = "gloo", .nproc_per_node = 2});
// parallel.run(training, config);`. What it does depends on where the program runs:
//  - a launcher already started this process as a rank (idist-run, srun, mpirun, torchrun):
//    the constructor initialises, run() calls fn(local_rank, args...) here. Spawn options
//    (nproc_per_node, nnodes, node_rank, master_addr, master_port) are refused then: the
//    launcher decided those.
//  - no launcher, and nproc_per_node > 1 or nnodes > 1: run() spawns (idist::spawn).
//  - otherwise: a world of one in this process.
// The destructor finalises what the constructor initialised.
class IDIST_API Parallel {
 public:
  explicit Parallel(SpawnOptions options = {});
  // A template, so that a braced list ({.backend = "gloo", .nproc_per_node = 2}) is never
  // taken for a std::string (GCC 12 finds that ambiguous otherwise).
  template <class S>
    requires std::convertible_to<S, std::string>
  explicit Parallel(S&& backend) : Parallel(SpawnOptions{.backend = std::string(std::forward<S>(backend))}) {}
  ~Parallel();
  Parallel(const Parallel&) = delete;
  Parallel& operator=(const Parallel&) = delete;

  // Whether run() starts ranks (true) or runs fn in this process.
  bool spawns() const noexcept { return spawns_; }

  template <class Fn, class... Args>
  void run(Fn&& fn, Args&&... args) {
    if (spawns_) return detail::spawn([&](int local_rank) { std::invoke(fn, local_rank, args...); }, options_);
    std::invoke(fn, get_local_rank(), args...);
  }

 private:
  SpawnOptions options_;
  bool spawns_ = false;
  bool initialized_ = false;
  int uncaught_at_start_ = std::uncaught_exceptions();
};

}  // namespace idist
