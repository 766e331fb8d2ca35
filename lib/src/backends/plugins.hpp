#pragma once
// Where backend plugins are looked for, and loading one (see plugin.hpp for the interface).

#include <string>
#include <string_view>
#include <vector>

#include "backends/plugin.hpp"

namespace idist::detail {

// The variable that adds directories (':'-separated, searched first) to look for plugins in.
inline constexpr std::string_view kPluginPathEnv = "IDIST_PLUGIN_PATH";

// IDIST_PLUGIN_PATH's directories, then idist/ beside the file libidist was loaded from
// (<libdir>/idist when installed, lib/idist in a build tree).
std::vector<std::string> plugin_dirs();

// The plugin for backend `name`, loaded on first use and kept for the life of the process.
// Throws std::runtime_error in one line naming what is missing: the plugin (and where it was
// looked for), a library it needs (as the dynamic loader says), or a matching version.
const BackendPlugin& load_plugin(std::string_view name);

}  // namespace idist::detail
