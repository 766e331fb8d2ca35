// The registry of backends: gloo is built into libidist; the others are plugins
// (backends/plugins.cpp), loaded on first use, so that libidist itself never needs MPI or
// CUDA at load time.

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "backend.hpp"
#include "backends/gloo/gloo_backend.hpp"
#include "backends/hierarchical/hierarchical_backend.hpp"
#include "backends/shm/shm_backend.hpp"
#include "backends/plugins.hpp"
#include "idist/env_contract.hpp"
#include "in_step_error.hpp"
#include "log.hpp"

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
// ucx likewise (IDIST_INTERHOST, interhost_backend()); a plugin, like mpi and nccl.
constexpr std::string_view kUcx = "ucx";

std::optional<Layout> native_layout(std::string_view name) {
  if (name == kShm || name == kHierarchical || name == kUcx) return std::nullopt;
  check_known(name);
  if (name == "gloo") return std::nullopt;
  const auto& plugin = load_plugin(name);
  if (plugin.native_layout == nullptr) return std::nullopt;
  return plugin.native_layout();
}

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendInit& init) {
  if (name == kShm) return make_shm_backend(init);
  if (name == kHierarchical) return make_hierarchical_backend(init);
  if (name == kUcx) return load_plugin(kUcx).make(init);
  check_known(name);
  if (name == "gloo") return one_per_host(init.hosts) ? make_interhost_backend(init) : make_gloo_backend(init);
  return load_plugin(name).make(init);
}

namespace {

// Empty when UCX can run here: its plugin loads and makes a context; else why not.
std::string ucx_unusable(const env::Contract& contract) {
  try {
    const auto& plugin = load_plugin(kUcx);
    if (plugin.probe == nullptr) return {};
    return plugin.probe(contract);
  } catch (const std::exception& e) {
    return e.what();
  }
}

// IDIST_VERBOSE (idist-run -v sets it for the ranks) asks for the choice in one line from
// the group's first member.
void say_choice(const BackendInit& init, const std::string& chosen, const std::string& why) {
  const std::string name(env::kVerbose);
  const char* verbose = std::getenv(name.c_str());
  bool on = false;
  try {
    on = verbose != nullptr && env::parse_flag(name, verbose);
  } catch (const std::exception&) {
  }
  if (!on || init.rank != 0) return;
  log().info("[idist] between hosts ({} members under {}): {} (IDIST_INTERHOST={}{})", init.size, init.key_prefix, chosen,
             init.contract.interhost, why.empty() ? "" : "; " + why);
}

}  // namespace

bool one_per_host(const std::vector<int>& hosts) {
  if (hosts.size() < 2) return false;
  std::vector<int> sorted(hosts);
  std::sort(sorted.begin(), sorted.end());
  return std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
}

std::string interhost_backend(const BackendInit& init) {
  const auto& mode = init.contract.interhost;
  if (mode == "gloo") return "gloo";
  const auto why = ucx_unusable(init.contract);
  if (mode == "ucx") {
    if (!why.empty()) throw std::runtime_error("IDIST_INTERHOST=ucx, but UCX cannot run here: " + why);
    return std::string(kUcx);
  }
  // auto: every member says whether it can, through the store, and all follow the answer.
  const auto prefix = init.key_prefix + "interhost/";
  init.store.set(prefix + std::to_string(init.rank), why.empty() ? std::vector<char>{'1'} : std::vector<char>{'0'});
  std::vector<std::string> keys;
  for (int r = 0; r < init.size; ++r) keys.push_back(prefix + std::to_string(r));
  init.store.wait(keys, init.timeout);
  std::string refused;
  for (int r = 0; r < init.size && refused.empty(); ++r)
    if (init.store.get(keys[static_cast<std::size_t>(r)]) != std::vector<char>{'1'})
      refused = r == init.rank ? why : member_word(init) + std::to_string(name_of(init, r)) + " cannot run UCX";
  const std::string chosen = refused.empty() ? std::string(kUcx) : "gloo";
  say_choice(init, chosen, refused);
  return chosen;
}

std::unique_ptr<Backend> make_interhost_backend(const BackendInit& init,
                                                const std::function<std::unique_ptr<Backend>()>& gloo) {
  if (interhost_backend(init) == kUcx) return load_plugin(kUcx).make(init);
  return gloo ? gloo() : make_gloo_backend(init);
}

}  // namespace idist::detail
