// The registry of backends compiled into this library. A backend that is known but not built
// fails at init with a clear message, never at link time.

#include "backend.hpp"
#include "backends/gloo/gloo_backend.hpp"

namespace idist::detail {

std::string_view built_in_backends() { return "gloo"; }

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendInit& init) {
  if (name == "gloo") return make_gloo_backend(init);
  if (name == "nccl" || name == "mpi")
    throw std::runtime_error("backend '" + std::string(name) + "' is not built into this libidist (built in: " +
                             std::string(built_in_backends()) + ")");
  throw std::runtime_error("unknown backend '" + std::string(name) + "' (expected gloo, nccl or mpi)");
}

}  // namespace idist::detail
