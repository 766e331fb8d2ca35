#pragma once
// Whether this rank's waits give the processor away at every turn instead of spinning: where
// its cpus are shared with another job's ranks (idist-run's notice, idist/common/cpus_shared.hpp,
// which may be raised mid-run), where its host's ranks outnumber the cores, or where
// IDIST_CPUS_SHARED=1 says so. Every wait asks it when it starts, and the spinning ones (shm,
// ucx) again every few turns: one load from a page that changes once in a while. (A group's own
// ranks outnumbering the cores is the shm backend's to see: its WaitPolicy.)

#include <atomic>
#include <cstdint>

#include "idist/env_contract.hpp"
#include "idist/export.hpp"

namespace idist::detail {

// From now on (init): IDIST_CPUS_SHARED=1 or 0 fixes the answer; auto says shared where
// LOCAL_WORLD_SIZE exceeds the host's cores, else follows the notice that IDIST_CPUS_SHARED_FD
// names (none, or one that cannot be read: not shared).
void follow_cpus_shared(const env::Contract& contract);

// The word the waits read: nonzero while they should yield. Exported for the backend plugins.
IDIST_API const std::atomic<std::uint32_t>& cpus_shared_word();

inline bool cpus_shared() { return cpus_shared_word().load(std::memory_order_relaxed) != 0; }

}  // namespace idist::detail
