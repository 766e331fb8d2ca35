#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "backend.hpp"

namespace idist::detail {

// The collectives of ranks that share one host, through one shared-memory segment per group
// (backends/shm/). Every member must be on this host (BackendInit::hosts); make_carrier
// chooses it in place of gloo where that holds (IDIST_INTRANODE).
std::unique_ptr<Backend> make_shm_backend(const BackendInit& init);

// Whether it serves a gloo group with this host map (carriers.hpp): two members or more, all on
// one host, and IDIST_INTRANODE is not off.
inline bool shm_can_serve(const std::vector<int>& hosts, const env::Contract& contract) {
  return contract.intranode != "off" && hosts.size() > 1 &&
         std::all_of(hosts.begin(), hosts.end(), [&](int h) { return h == hosts.front(); });
}

}  // namespace idist::detail
