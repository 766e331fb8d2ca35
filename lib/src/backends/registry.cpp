// The registry of backends: gloo is built into libidist; the others are plugins
// (backends/plugins.cpp), loaded on first use, so that libidist itself never needs MPI or
// CUDA at load time.

#include <cstring>
#include <stdexcept>

#include "backend.hpp"
#include "backends/gloo/gloo_backend.hpp"
#include "backends/hierarchical/hierarchical_backend.hpp"
#include "backends/shm/shm_backend.hpp"
#include "backends/plugins.hpp"
#include "idist/env_contract.hpp"
#include "in_step_error.hpp"

namespace idist::detail {

void Backend::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
}

void Backend::unsupported(std::string_view op) const {
  throw InStepError("the " + std::string(name()) + " backend does not support " + std::string(op));
}

// The defaults: a backend overrides what it can do (backend.hpp).
std::unique_ptr<Backend> Backend::make_group(const GroupInit&) { unsupported("new_group"); }
void Backend::all_reduce(void*, std::size_t, DType, ReduceOp) { unsupported("all_reduce"); }
void Backend::reduce(void*, std::size_t, DType, ReduceOp, int) { unsupported("reduce"); }
void Backend::reduce_scatter(const void*, void*, std::size_t, DType, ReduceOp) { unsupported("reduce_scatter"); }
void Backend::all_gather(const void*, void*, std::size_t) { unsupported("all_gather"); }
void Backend::all_gather_v(const void*, void*, std::span<const std::size_t>) { unsupported("all_gather_v"); }
void Backend::gather(const void*, void*, std::size_t, int) { unsupported("gather"); }
void Backend::scatter(const void*, void*, std::size_t, int) { unsupported("scatter"); }
void Backend::broadcast(void*, std::size_t, int) { unsupported("broadcast"); }
void Backend::barrier() { unsupported("barrier"); }
Backend::Completion Backend::send(const void*, std::size_t, int, std::uint32_t) { unsupported("send"); }
Backend::Completion Backend::recv(void*, std::size_t, int, std::uint32_t) { unsupported("recv"); }

namespace {
void check_known(std::string_view name) {
  if (!env::is_backend_name(name))
    throw std::runtime_error("unknown backend '" + std::string(name) + "' (expected " + env::backend_choices() + ")");
}
}  // namespace

// shm and hierarchical are no backends a user names: the runtime puts them under gloo where
// ranks of a group share a host (IDIST_INTRANODE, gloo_carrier()).
constexpr std::string_view kShm = "shm";
constexpr std::string_view kHierarchical = "hierarchical";

std::optional<Layout> native_layout(std::string_view name) {
  if (name == kShm || name == kHierarchical) return std::nullopt;
  check_known(name);
  if (name == "gloo") return std::nullopt;
  const auto& plugin = load_plugin(name);
  if (plugin.native_layout == nullptr) return std::nullopt;
  return plugin.native_layout();
}

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendInit& init) {
  if (name == kShm) return make_shm_backend(init);
  if (name == kHierarchical) return make_hierarchical_backend(init);
  check_known(name);
  if (name == "gloo") return make_gloo_backend(init);
  return load_plugin(name).make(init);
}

}  // namespace idist::detail
