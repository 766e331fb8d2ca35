#pragma once
// Whether a backend's plugin (libidist-backend-NAME.so: mpi, nccl, ucx) can be used here, as
// init() would find, load and check it: the one search libidist has, also what `idist-run
// --version` and `--dry-run` report (as Open MPI's ompi_info lists its components through the
// loader that loads them).

#include <string>
#include <string_view>

#include "idist/export.hpp"

namespace idist {

struct PluginStatus {
  std::string path;       // where the plugin was found; empty where it was not
  std::string looked_in;  // the directories searched, in order, ", "-separated
  std::string error;      // empty when it loads; else the line init() raises for it
  bool usable() const { return error.empty(); }
};

// The plugin of backend `name`, searched where init() searches (IDIST_PLUGIN_PATH's
// directories, then idist/ beside libidist) and checked as init() checks it (the loader, the
// entry point, the plugin ABI and the idist version). A plugin this process has not loaded is
// tried in a child process, so that what it brings (MPI's, CUDA's libraries and their
// constructors) never runs in the caller.
IDIST_API PluginStatus plugin_status(std::string_view name);

}  // namespace idist
