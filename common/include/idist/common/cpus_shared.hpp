#pragma once
// idist-run's notice to its ranks that their cpus are shared with another idist-run job's ranks
// (launchers/cpu_claims.hpp sees it: a job left without a free cpu per rank runs unbound, and a
// bound job lets go when it sees one). Ranks on their own cores spin while they wait for a
// peer, which answers within microseconds; ranks that outnumber the cores must yield instead,
// or the spinner keeps the core from the very rank it waits for for a whole time slice (two
// fake hosts of 2 ranks on 2 cpus: small all_reduces at 20-25 us or at 76-110 us per call,
// whole runs in one mode or the other; every waiting rank yielding: never the slow mode,
// docs/BENCHMARKS.md). The second job knows at its start, the first only when the second
// starts, mid-run: hence a page in memory that idist-run writes and its ranks read at every
// wait, not a variable.
//
// One page per job, a memfd that the ranks inherit (IDIST_CPUS_SHARED_FD): nothing on a file
// system, nothing left behind. Like the env contract, a format both halves agree on.

#include <atomic>
#include <cstdint>

namespace idist::common {

struct CpusSharedPage {
  static constexpr std::uint64_t kMagic = 0x3144524148535049ull;  // "IPSHARD1" in memory
  std::uint64_t magic = kMagic;
  // 1: the cpus are shared now; 0: not, or no longer (launchers/cpu_claims.hpp, HeldBinding::Role,
  // says when each job raises and lowers it).
  std::atomic<std::uint32_t> shared{0};
};
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "the page is read by another process");

}  // namespace idist::common
