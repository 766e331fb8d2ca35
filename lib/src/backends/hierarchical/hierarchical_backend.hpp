#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "backends/carriers.hpp"

namespace idist::detail {

// A group that spans hosts, some of which run several of its ranks (the shape of Open MPI's
// coll/han): shared memory within each host, ucx or gloo among one leader per host
// (IDIST_INTERHOST), and gloo over every rank for what gains nothing from the split
// (backends/hierarchical/). That gloo is made by `flat` when given (a group of the caller's
// gloo backend, sharing its device), else of its own.
std::unique_ptr<Backend> make_hierarchical_backend(const BackendInit& init, const GlooMaker& flat = {});

// Whether it serves a gloo group with this host map (carriers.hpp): some members share a
// host, not all, and IDIST_INTRANODE is not off.
bool hierarchical_can_serve(const std::vector<int>& hosts, const env::Contract& contract);

// What carries a hierarchical backend's traffic among host leaders ("ucx" or "gloo"), as every
// member knows it (its host's leader tells the others at creation); empty for other backends.
std::string leaders_transport(const Backend& backend);

}  // namespace idist::detail
