#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"

namespace idist::detail {

// A group that spans hosts, some of which run several of its ranks (the shape of Open MPI's
// coll/han): shared memory within each host, ucx or gloo among one leader per host
// (IDIST_INTERHOST), and gloo over every rank for what gains nothing from the split
// (backends/hierarchical/).
std::unique_ptr<Backend> make_hierarchical_backend(const BackendInit& init);

// What carries a hierarchical backend's traffic among host leaders ("ucx" or "gloo"), as every
// member knows it (its host's leader tells the others at creation); empty for other backends.
std::string leaders_transport(const Backend& backend);

// Which backend carries a gloo group with this host map: "shm" when every rank shares one host,
// "gloo" when no two do (or the map is unknown), "hierarchical" in between. The one place the
// choice is made, for the world (runtime.cpp) and for groups made from a composite.
std::string_view gloo_carrier(const std::vector<int>& hosts);

// Whether a group with this host map has one member per host, on two hosts or more: the
// groups IDIST_INTERHOST chooses the transport for.
bool one_per_host(const std::vector<int>& hosts);

// What carries a gloo group with one member per host (one_per_host; the hierarchical
// backend's leaders): "ucx" or "gloo", as IDIST_INTERHOST says (backends/registry.cpp, the
// one place the choice is made). Collective over init's members under "auto": each says
// whether UCX can run where it is, and ucx is chosen only when every member can, so that no
// two members make different backends. "ucx" where it cannot run: an error naming why.
std::string interhost_backend(const BackendInit& init);

// That backend: ucx, or gloo made by `gloo` (a group of an existing gloo backend, sharing its
// device) when given, else a gloo backend of its own.
std::unique_ptr<Backend> make_interhost_backend(const BackendInit& init,
                                                const std::function<std::unique_ptr<Backend>()>& gloo = {});

}  // namespace idist::detail
