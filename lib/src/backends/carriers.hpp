#pragma once
// What carries a gloo group: the gloo backend asks for TCP between every pair of ranks, but
// where ranks share a host shared memory is faster, and between hosts UCX may be. Each built-in
// carrier says whether it can serve a group (its can_serve, in its own file, as NCCL's
// transports answer canConnect), and registry.cpp chooses, the one place it is decided, in
// this order (the first that can serve):
//   shm           every member on one host (backends/shm/)
//   hierarchical  some members share a host, not all: shm within each host, and what serves
//                 one leader per host among them (backends/hierarchical/)
//   ucx           one member per host, and IDIST_INTERHOST not gloo: ucx where every member
//                 can run it (auto), or must (ucx) (backends/ucx/, a plugin)
//   gloo          any group
// IDIST_INTRANODE=off turns shm and hierarchical away; a group of one is gloo's.

#include <functional>
#include <memory>
#include <vector>

#include "backend.hpp"

namespace idist::detail {

// Makes the gloo backend of a group where the caller has one to derive it from (the
// hierarchical backend's flat one, whose device its groups share); empty: a gloo of its own.
using GlooMaker = std::function<std::unique_ptr<Backend>()>;

// The backend that carries a gloo group of init's members, chosen as above. Collective over
// init's members (each creation is, and choosing ucx under IDIST_INTERHOST=auto asks every
// member through the store): every member chooses the same.
std::unique_ptr<Backend> make_carrier(const BackendInit& init, const GlooMaker& gloo = {});

// Whether shared memory carries some of a gloo group with this host map under these settings
// (shm or hierarchical would serve it): what IDIST_INTRANODE=shm requires of the world.
bool shared_memory_serves(const std::vector<int>& hosts, const env::Contract& contract);

}  // namespace idist::detail
