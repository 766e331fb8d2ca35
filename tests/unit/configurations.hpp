#pragma once
// The backend configurations the collective, grid and point-to-point tests run over, one
// doctest SUBCASE each in every test case (as Gloo instantiates each test over its
// transports). Each used to be a ctest entry that re-ran the binary with other environment
// variables; now the settings are fields handed to run_ranks (ranks.hpp), and ctest's entries
// pick groups of subcases with --subcase= so that they still run in parallel
// (tests/CMakeLists.txt). Running a binary by hand runs every configuration.

#include <doctest/doctest.h>

#include <cstdlib>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "idist/env_contract.hpp"
#include "idist/plugins.hpp"

namespace test {

struct Config {
  const char* name;          // the SUBCASE's name, which --subcase= matches
  std::string_view backend;  // as make_backend names it: gloo, shm, hierarchical or ucx
  // The fake host map (threads share memory, so any map can be faked in one process): ""
  // (every rank on host 0), "pairs" {0,0,1,1,...}, "cyclic" {0,1,0,1,...: a host's ranks are
  // not neighbours} or "distinct" {0,1,2,...}.
  std::string_view hosts;
  // contract.interhost: what carries the leaders and groups of one rank per host. "gloo" where
  // ucx is not under test, so that a configuration never depends on where the plugin is found;
  // "ucx" fails rather than falls back to gloo.
  std::string_view interhost = "gloo";
  idist::env::Contract::Tuning tuning{};

  bool needs_ucx() const { return backend == "ucx" || interhost == "ucx"; }
  // ucx carrying the collectives between the ranks themselves (not only among leaders).
  bool ucx_between_ranks() const { return backend == "ucx" || (interhost == "ucx" && hosts == "distinct"); }
};

// Which host each of `size` ranks is on, as config.hosts says. A map it does not know is an
// error: taken as one host, a misspelt map would pass while testing nothing between hosts.
inline std::vector<int> hosts_of(const Config& config, int size) {
  const auto& map = config.hosts;
  if (map != "" && map != "pairs" && map != "cyclic" && map != "distinct")
    throw std::invalid_argument("no host map '" + std::string(map) + "'");
  std::vector<int> hosts(static_cast<std::size_t>(size), 0);
  for (int r = 0; r < size; ++r) {
    if (map == "pairs") hosts[static_cast<std::size_t>(r)] = r / 2;
    if (map == "cyclic") hosts[static_cast<std::size_t>(r)] = r % 2;
    if (map == "distinct") hosts[static_cast<std::size_t>(r)] = r;
  }
  return hosts;
}

// all_reduce in overlapping segments (the hierarchical backend's pipeline), cut small enough
// that the grids' counts take it; rails off, so that equal hosts take the segments too (over
// gloo neither is on by default; ucx leaders take the rails by default).
inline idist::env::Contract::Tuning small_segments() {
  idist::env::Contract::Tuning tuning;
  tuning.hier_segment = 32768;
  tuning.hier_rails_from = 0;
  return tuning;
}

// Every collective message of ucx on its TCP lanes (by default from 64 KiB).
inline idist::env::Contract::Tuning all_on_lanes() {
  idist::env::Contract::Tuning tuning;
  tuning.ucx_tcp_from = 1;
  return tuning;
}

// Every configuration, the ucx ones only where CMake built the plugin (IDIST_TEST_UCX_DIR).
inline std::vector<Config> all_configurations() {
  std::vector<Config> all = {
      {.name = "gloo", .backend = "gloo", .hosts = ""},
      {.name = "shm", .backend = "shm", .hosts = ""},
      {.name = "hierarchical_pairs", .backend = "hierarchical", .hosts = "pairs"},
      {.name = "hierarchical_cyclic", .backend = "hierarchical", .hosts = "cyclic"},
      {.name = "hierarchical_distinct", .backend = "hierarchical", .hosts = "distinct"},
      {.name = "hierarchical_segments_pairs", .backend = "hierarchical", .hosts = "pairs", .tuning = small_segments()},
      {.name = "hierarchical_segments_cyclic", .backend = "hierarchical", .hosts = "cyclic", .tuning = small_segments()},
  };
#ifdef IDIST_TEST_UCX_DIR
  const std::vector<Config> ucx = {
      {.name = "ucx", .backend = "ucx", .hosts = "", .interhost = "auto"},  // a job's default
      // ucx as the hierarchical backend's leaders, and again with its all_reduce in segments.
      {.name = "ucx_leaders", .backend = "hierarchical", .hosts = "pairs", .interhost = "ucx"},
      {.name = "ucx_leaders_segments",
       .backend = "hierarchical",
       .hosts = "pairs",
       .interhost = "ucx",
       .tuning = small_segments()},
      // ucx carrying a gloo group of one rank per host, its TCP lanes as by default, and again
      // with every collective message on the lanes.
      {.name = "ucx_one_per_host", .backend = "gloo", .hosts = "distinct", .interhost = "ucx"},
      {.name = "ucx_lanes", .backend = "gloo", .hosts = "distinct", .interhost = "ucx", .tuning = all_on_lanes()},
  };
  all.insert(all.end(), ucx.begin(), ucx.end());
#endif
  return all;
}

// Whether the ucx plugin loads, asked once, before any rank thread runs: the library finds
// plugins through IDIST_PLUGIN_PATH only (no option), read when the plugin is first loaded,
// so the build's directory goes there, ahead of any the caller gave. Where it does not load,
// says so on stderr in a line ctest's ucx entries take as a skip (tests/CMakeLists.txt).
inline bool ucx_plugin_loads() {
#ifdef IDIST_TEST_UCX_DIR
  static const bool loads = [] {
    std::string path = IDIST_TEST_UCX_DIR;
    if (const char* given = std::getenv("IDIST_PLUGIN_PATH"); given != nullptr && *given != '\0')
      path += std::string(":") + given;
    ::setenv("IDIST_PLUGIN_PATH", path.c_str(), 1);
    const auto status = idist::plugin_status("ucx");
    if (!status.usable()) std::cerr << "SKIPPED the ucx configurations: " << status.error << "\n";
    return status.usable();
  }();
  return loads;
#else
  return false;
#endif
}

// The configurations that run here: the ucx ones only where the plugin loads.
inline const std::vector<Config>& configurations() {
  static const std::vector<Config> usable = [] {
    std::vector<Config> out;
    for (const auto& c : all_configurations())
      if (!c.needs_ucx() || ucx_plugin_loads()) out.push_back(c);
    return out;
  }();
  return usable;
}

// For the test cases about one backend's own behaviour.
inline bool shm_only(const Config& config) { return config.backend == "shm"; }

// body(config) in a SUBCASE named after each configuration that wanted(config) accepts.
// doctest runs the test case once per SUBCASE, entering only that one. An exception is a
// failure of that configuration only: let through, doctest would skip the configurations after
// it, as separate runs never did.
template <class Wanted, class Body>
void for_each_backend_where(Wanted wanted, Body body) {
  for (const auto& config : configurations()) {
    if (!std::invoke(wanted, config)) continue;
    SUBCASE(config.name) {
      try {
        body(config);
      } catch (const std::exception& e) {
        const std::string failure = std::string(config.name) + " threw: " + e.what();
        FAIL_CHECK(failure);
      }
    }
  }
}

template <class Body>
void for_each_backend(Body body) {
  for_each_backend_where([](const Config&) { return true; }, body);
}

}  // namespace test
