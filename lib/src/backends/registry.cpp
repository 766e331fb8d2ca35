// The registry of backends: gloo is built into libidist; the others are plugins
// (backends/plugins.cpp), loaded on first use, so that libidist itself never needs MPI or
// CUDA at load time. And the one place that chooses what carries a gloo group (carriers.hpp).

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "backend.hpp"
#include "backends/gloo/gloo_backend.hpp"
#include "backends/hierarchical/hierarchical_backend.hpp"
#include "backends/shm/shm_backend.hpp"
#include "backends/carriers.hpp"
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

constexpr std::string_view kUcx = "ucx";

// Whether every member of a group is on its own host, on two hosts or more.
bool one_per_host(const std::vector<int>& hosts) {
  if (hosts.size() < 2) return false;
  std::vector<int> sorted(hosts);
  std::sort(sorted.begin(), sorted.end());
  return std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
}

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
void say_choice(const BackendInit& init, std::string_view chosen, const std::string& why) {
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

// ucx serves a group with one member per host, unless IDIST_INTERHOST says gloo.
bool ucx_can_serve(const std::vector<int>& hosts, const env::Contract& contract) {
  return contract.interhost != "gloo" && one_per_host(hosts);
}

// Whether every member can run UCX: under IDIST_INTERHOST=ucx each must (an error naming why
// where it cannot); under auto each says through the store, and all follow the answer, so
// that no two members make different backends.
bool ucx_agreed(const BackendInit& init) {
  const auto why = ucx_unusable(init.contract);
  if (init.contract.interhost == "ucx") {
    if (!why.empty()) throw std::runtime_error("IDIST_INTERHOST=ucx, but UCX cannot run here: " + why);
    return true;
  }
  const auto prefix = init.key_prefix + "interhost/";
  init.store.set(prefix + std::to_string(init.rank), why.empty() ? std::vector<char>{'1'} : std::vector<char>{'0'});
  std::vector<std::string> keys;
  for (int r = 0; r < init.size; ++r) keys.push_back(prefix + std::to_string(r));
  init.store.wait(keys, init.timeout);
  std::string refused;
  for (int r = 0; r < init.size && refused.empty(); ++r)
    if (init.store.get(keys[static_cast<std::size_t>(r)]) != std::vector<char>{'1'})
      refused = r == init.rank ? why : member_word(init) + std::to_string(name_of(init, r)) + " cannot run UCX";
  say_choice(init, refused.empty() ? kUcx : "gloo", refused);
  return refused.empty();
}

bool always(const std::vector<int>&, const env::Contract&) { return true; }

// A carrier of gloo groups (carriers.hpp).
struct Carrier {
  std::string_view name;
  bool (*can_serve)(const std::vector<int>& hosts, const env::Contract& contract);
  // Collective: whether every member can run it, where can_serve cannot tell from what all
  // members know alike; nullptr: no need to ask.
  bool (*agreed)(const BackendInit& init);
  std::unique_ptr<Backend> (*make)(const BackendInit& init, const GlooMaker& gloo);
};

// In the order they are preferred; gloo serves any group.
constexpr Carrier kCarriers[] = {
    {"shm", shm_can_serve, nullptr, [](const BackendInit& init, const GlooMaker&) { return make_shm_backend(init); }},
    {"hierarchical", hierarchical_can_serve, nullptr, make_hierarchical_backend},
    {kUcx, ucx_can_serve, ucx_agreed, [](const BackendInit& init, const GlooMaker&) { return load_plugin(kUcx).make(init); }},
    {"gloo", always, nullptr,
     [](const BackendInit& init, const GlooMaker& gloo) { return gloo ? gloo() : make_gloo_backend(init); }},
};

// The carrier named `name`, for a test that asks for one by name; nullptr if none is.
const Carrier* carrier_named(std::string_view name) {
  for (const auto& carrier : kCarriers)
    if (carrier.name == name) return &carrier;
  return nullptr;
}

}  // namespace

std::unique_ptr<Backend> make_carrier(const BackendInit& init, const GlooMaker& gloo) {
  for (const auto& carrier : kCarriers) {
    if (!carrier.can_serve(init.hosts, init.contract)) continue;
    if (carrier.agreed != nullptr && !carrier.agreed(init)) continue;
    return carrier.make(init, gloo);
  }
  throw std::logic_error("no carrier serves the group");  // gloo serves any
}

bool shared_memory_serves(const std::vector<int>& hosts, const env::Contract& contract) {
  return shm_can_serve(hosts, contract) || hierarchical_can_serve(hosts, contract);
}

std::optional<Layout> native_layout(std::string_view name) {
  if (carrier_named(name) != nullptr) return std::nullopt;
  check_known(name);
  const auto& plugin = load_plugin(name);
  if (plugin.native_layout == nullptr) return std::nullopt;
  return plugin.native_layout();
}

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendInit& init) {
  if (name == "gloo") return make_carrier(init);
  if (const auto* carrier = carrier_named(name)) return carrier->make(init, {});
  check_known(name);
  return load_plugin(name).make(init);
}

}  // namespace idist::detail
