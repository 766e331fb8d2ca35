#pragma once

#include "backend.hpp"

namespace idist::detail {

// Gloo over TCP, host memory. Bootstraps its full mesh from the store under init.key_prefix.
std::unique_ptr<Backend> make_gloo_backend(const BackendInit& init);

}  // namespace idist::detail
