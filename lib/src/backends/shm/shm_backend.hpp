#pragma once

#include <memory>

#include "backend.hpp"

namespace idist::detail {

// The collectives of ranks that share one host, through one shared-memory segment per group
// (backends/shm/). Every member must be on this host (BackendInit::hosts); the runtime chooses
// it in place of gloo where that holds (IDIST_INTRANODE).
std::unique_ptr<Backend> make_shm_backend(const BackendInit& init);

}  // namespace idist::detail
