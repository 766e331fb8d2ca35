#pragma once
// Whether this rank's waits give the processor away at every turn instead of spinning: where
// the job's ranks on its machine outnumber the cores (fake hosts of one machine included), or
// where IDIST_CPUS_SHARED=1 says so. Ranks on their own cores spin while they wait for a peer,
// which answers within microseconds; ranks that outnumber the cores must yield instead, or the
// spinner keeps the core from the very rank it waits for for a whole time slice (two fake hosts
// of 2 ranks on 2 cpus: small all_reduces at 20-25 us or at 76-110 us per call; every waiting
// rank yielding: never the slow mode, docs/BENCHMARKS.md). Another job's ranks on the same cpus
// are no reason: this job's waits wait for none of them, and spinning beside them costs them no
// more than Open MPI's spinning does (bench/beside_job.sh, issue 48). Every wait asks it when it
// starts (the spinning ones again every few turns, which costs one load). (A group's own ranks
// outnumbering the cores is the shm backend's to see: its WaitPolicy.) It changes only at a join
// (init, a re-form), on the thread making it; waits of other threads read it as they come.

#include <atomic>
#include <cstdint>

#include "idist/env_contract.hpp"
#include "idist/export.hpp"

namespace idist::detail {

// From now on (init, and again once a join counted `ranks_here`, the job's ranks on this
// machine): IDIST_CPUS_SHARED=1 or 0 fixes the answer; auto says shared where they (before any
// join: LOCAL_WORLD_SIZE) exceed the machine's cores.
void follow_cpus_shared(const env::Contract& contract, int ranks_here = 0);

// The word the waits read: nonzero while they should yield. Exported for the backend plugins.
IDIST_API const std::atomic<std::uint32_t>& cpus_shared_word();

inline bool cpus_shared() { return cpus_shared_word().load(std::memory_order_relaxed) != 0; }

}  // namespace idist::detail
