#pragma once

#include <memory>
#include <string>

#include "backend.hpp"

namespace idist::detail {

// UCX's UCP tag API between the members: every collective and point-to-point, over whatever
// UCX reaches (TCP, RDMA, shared memory). Worker addresses are exchanged through the store
// under init.key_prefix. A plugin (libidist-backend-ucx.so), so that libidist never needs
// libucx at load time.
std::unique_ptr<Backend> make_ucx_backend(const BackendInit& init);

// Empty when a UCX context can be made here with `contract`'s settings, else why not (one
// line). The context is kept for the backends made later.
std::string ucx_probe(const env::Contract& contract);

}  // namespace idist::detail
