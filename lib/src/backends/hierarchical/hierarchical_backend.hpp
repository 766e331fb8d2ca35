#pragma once

#include <memory>

#include "backend.hpp"

namespace idist::detail {

// A group that spans hosts, some of which run several of its ranks (the shape of Open MPI's
// coll/han): shared memory within each host, gloo among one leader per host, and gloo over
// every rank for what gains nothing from the split (backends/hierarchical/).
std::unique_ptr<Backend> make_hierarchical_backend(const BackendInit& init);

// Which backend carries a gloo group with this host map: "shm" when every rank shares one host,
// "gloo" when no two do (or the map is unknown), "hierarchical" in between. The one place the
// choice is made, for the world (runtime.cpp) and for groups made from a composite.
std::string_view gloo_carrier(const std::vector<int>& hosts);

}  // namespace idist::detail
