// The registry of backends: gloo is built into libidist; the others are plugins
// (backends/plugins.cpp), loaded on first use, so that libidist itself never needs MPI or
// CUDA at load time.

#include <cstring>

#include "backend.hpp"
#include "backends/gloo/gloo_backend.hpp"
#include "backends/plugins.hpp"
#include "idist/env_contract.hpp"

namespace idist::detail {

void Backend::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
}

namespace {
void check_known(std::string_view name) {
  if (!env::is_backend_name(name))
    throw std::runtime_error("unknown backend '" + std::string(name) + "' (expected " + env::backend_choices() + ")");
}
}  // namespace

std::optional<Layout> native_layout(std::string_view name) {
  check_known(name);
  if (name == "gloo") return std::nullopt;
  const auto& plugin = load_plugin(name);
  if (plugin.native_layout == nullptr) return std::nullopt;
  return plugin.native_layout();
}

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendInit& init) {
  check_known(name);
  if (name == "gloo") return make_gloo_backend(init);
  return load_plugin(name).make(init);
}

}  // namespace idist::detail
