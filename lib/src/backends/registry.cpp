// The registry of backends compiled into this library. A backend that is known but not built
// fails at init with a clear message, never at link time.

#include <cstring>

#include "backend.hpp"
#include "idist/env_contract.hpp"
#include "backends/gloo/gloo_backend.hpp"
#ifdef IDIST_WITH_MPI
#include "backends/mpi/mpi_backend.hpp"
#endif
#ifdef IDIST_WITH_NCCL
#include "backends/nccl/nccl_backend.hpp"
#endif

namespace idist::detail {

void Backend::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
}

std::string_view built_in_backends() {
  return "gloo"
#ifdef IDIST_WITH_MPI
         ", mpi"
#endif
#ifdef IDIST_WITH_NCCL
         ", nccl"
#endif
      ;
}

namespace {
[[noreturn, maybe_unused]] void not_built(std::string_view name) {
  throw std::runtime_error("backend '" + std::string(name) + "' is not built into this libidist (built in: " +
                           std::string(built_in_backends()) + ")");
}
}  // namespace

std::optional<Layout> native_layout(std::string_view name) {
#ifdef IDIST_WITH_MPI
  if (name == "mpi") return mpi_layout();
#else
  (void)name;
#endif
  return std::nullopt;
}

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendInit& init) {
  if (name == "gloo") return make_gloo_backend(init);
  if (name == "mpi") {
#ifdef IDIST_WITH_MPI
    return make_mpi_backend(init);
#else
    not_built(name);
#endif
  }
  if (name == "nccl") {
#ifdef IDIST_WITH_NCCL
    return make_nccl_backend(init);
#else
    not_built(name);
#endif
  }
  throw std::runtime_error("unknown backend '" + std::string(name) + "' (expected " + env::backend_choices() + ")");
}

}  // namespace idist::detail
