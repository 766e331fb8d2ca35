#pragma once
// The interface between libidist and a backend plugin, libidist-backend-NAME.so (the mpi and
// nccl backends): one entry point with C linkage, idist_backend_plugin_NAME, returning a
// BackendPlugin. Plugins are built from this tree against this libidist, so C++ types cross
// the boundary as they are; what libidist exports for them is marked IDIST_API in
// backend.hpp, store.hpp, reduce/kernels.hpp and common/cpus_shared.hpp. Loading, searching and the messages when a
// plugin or its libraries are missing live in plugins.cpp.

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "backend.hpp"
#include "idist/export.hpp"

namespace idist::detail {

// Raised with every change to Backend, BackendInit, Layout, Store, env::Contract or
// BackendPlugin: a plugin built against another value (or another idist version) is refused,
// naming both. The sizes below catch what a forgotten raise would miss between two builds of
// one version.
// 2: Backend::traits(), default operations, BackendInit::hosts; 3: Backend::cancel_transfers()
// 5: BackendPlugin::probe, env::Contract::interhost; 6: env::Contract::cpus_shared(_fd)
// 7: env::Contract::tuning; 8: Backend::abort(); 9: BackendInit::superseded, env::Contract::recovery_*
// 10: Backend::before_wait(), BackendTraits::runs_before_wait
inline constexpr int kPluginAbi = 10;

struct PluginSizes {
  std::size_t backend_init = sizeof(BackendInit);
  std::size_t contract = sizeof(env::Contract);
  std::size_t layout = sizeof(Layout);
  friend bool operator==(const PluginSizes&, const PluginSizes&) = default;
};

struct BackendPlugin {
  int abi = kPluginAbi;
  const char* idist_version = nullptr;  // IDIST_VERSION of the build that made the plugin
  std::unique_ptr<Backend> (*make)(const BackendInit&) = nullptr;
  // For a backend that brings its own world (mpi): starts it and says where this process
  // sits. nullptr for backends that bootstrap from the env contract and the store.
  Layout (*native_layout)() = nullptr;
  // Whether the backend can run here with these settings, without connecting to anyone: empty
  // when it can, else why not (one line). nullptr: not asked (the backend is always tried).
  // What IDIST_INTERHOST=auto asks of ucx.
  std::string (*probe)(const env::Contract&) = nullptr;
  PluginSizes sizes{};
};

}  // namespace idist::detail

// Defines the plugin's entry point, idist_backend_plugin_NAME; the rest of the plugin stays
// hidden.
#define IDIST_BACKEND_PLUGIN_PROBED(NAME, MAKE, NATIVE_LAYOUT, PROBE)                              \
  extern "C" IDIST_API const ::idist::detail::BackendPlugin* idist_backend_plugin_##NAME() {       \
    static const ::idist::detail::BackendPlugin plugin{.abi = ::idist::detail::kPluginAbi,        \
                                                       .idist_version = IDIST_VERSION,             \
                                                       .make = (MAKE),                             \
                                                       .native_layout = (NATIVE_LAYOUT),           \
                                                       .probe = (PROBE)};                          \
    return &plugin;                                                                                \
  }
#define IDIST_BACKEND_PLUGIN(NAME, MAKE, NATIVE_LAYOUT) IDIST_BACKEND_PLUGIN_PROBED(NAME, MAKE, NATIVE_LAYOUT, nullptr)
