#include "idist/env_contract.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace idist::env {
namespace {

[[noreturn]] void fail(std::string_view name, std::string_view value, std::string_view why) {
  throw ContractError(std::string(name) + "='" + std::string(value) + "': " + std::string(why));
}

// Strict integer parse: the whole value, no sign tricks, no whitespace.
int parse_int(std::string_view name, std::string_view value, int min, int max) {
  int out = 0;
  const auto* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (value.empty() || ec == std::errc::invalid_argument || ptr != end)
    fail(name, value, "not an integer");
  if (ec == std::errc::result_out_of_range || out < min || out > max)
    fail(name, value, "must be between " + std::to_string(min) + " and " + std::to_string(max));
  return out;
}

struct Reader {
  const Lookup& lookup;

  std::optional<std::string> get(std::string_view name) const { return lookup(name); }

  std::string require(std::string_view name, std::string_view why) const {
    auto value = lookup(name);
    if (!value) throw ContractError(std::string(name) + " is not set (" + std::string(why) + ")");
    return *value;
  }

  std::optional<int> get_int(std::string_view name, int min, int max) const {
    auto value = lookup(name);
    if (!value) return std::nullopt;
    return parse_int(name, *value, min, max);
  }
};

constexpr int kMaxRanks = 1 << 24;

}  // namespace

Lookup process_env() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

std::chrono::milliseconds parse_timeout(std::string_view name, std::string_view value) {
  double seconds = 0;
  const auto* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, seconds);
  if (value.empty() || ec != std::errc() || ptr != end || !std::isfinite(seconds))
    fail(name, value, "not a number of seconds");
  if (seconds <= 0 || seconds > 30.0 * 24 * 3600)
    fail(name, value, "must be more than 0 and at most 30 days");
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(seconds * 1000)));
}

bool is_backend_name(std::string_view name) {
  return std::find(std::begin(kBackendNames), std::end(kBackendNames), name) != std::end(kBackendNames);
}

std::string backend_choices() {
  std::string out;
  const auto n = std::size(kBackendNames);
  for (std::size_t i = 0; i < n; ++i)
    out += std::string(i == 0 ? "" : i + 1 == n ? " or " : ", ") + std::string(kBackendNames[i]);
  return out;
}

namespace {
std::string lowercase(std::string_view value) {
  std::string lower(value);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower;
}
}  // namespace

bool parse_flag(std::string_view name, std::string_view value) {
  const auto lower = lowercase(value);
  if (lower == "1" || lower == "true" || lower == "yes") return true;
  if (lower.empty() || lower == "0" || lower == "false" || lower == "no") return false;
  throw ContractError(std::string(name) + "='" + std::string(value) + "': expected 1 or 0 (also true/false, yes/no)");
}

Contract read_contract(const Lookup& lookup) {
  const Reader env{lookup};
  Contract c;

  // Settings that apply even to a world of one.
  if (auto v = env.get(kTimeout)) c.timeout = parse_timeout(kTimeout, *v);
  if (auto v = env.get(kBackend)) {
    if (!is_backend_name(*v)) fail(kBackend, *v, "expected " + backend_choices());
    c.backend = *v;
  }
  if (auto v = env.get(kJobToken)) c.job_token = *v;
  if (auto v = env.get(kRunId)) c.run_id = *v;
  if (auto v = env.get(kLauncher)) c.launcher = *v;
  if (auto v = env.get(kGlooSocketIfname)) c.gloo_socket_ifname = *v;
  if (auto v = env.get(kIntranode)) {
    if (*v != "auto" && *v != "shm" && *v != "off") fail(kIntranode, *v, "expected auto, shm or off");
    c.intranode = *v;
  }
  if (auto v = env.get(kInterhost)) {
    if (*v != "auto" && *v != "ucx" && *v != "gloo") fail(kInterhost, *v, "expected auto, ucx or gloo");
    c.interhost = *v;
  }
  auto flag = [&](std::string_view name, bool& out) {
    if (const auto v = env.get(name)) out = parse_flag(name, *v);
  };
  flag(kDebug, c.debug);
  flag(kFlightRecorder, c.flight_recorder);
  flag(kStoreBindAll, c.store_bind_all);
  if (auto v = env.get(kCpusShared); v && !v->empty()) {  // empty: as if unset
    try {
      c.cpus_shared = lowercase(*v) == "auto" ? "auto" : parse_flag(kCpusShared, *v) ? "1" : "0";
    } catch (const ContractError&) {
      fail(kCpusShared, *v, "expected auto, 1 or 0");
    }
  }
  if (auto v = env.get_int(kRestartCount, 0, std::numeric_limits<int>::max())) c.restart_count = *v;
  if (auto v = env.get(kRecoveryStore); v && !v->empty()) {
    const auto colon = v->rfind(':');
    int port = 0;
    const char* end = v->data() + v->size();
    const auto [ptr, ec] = colon == std::string::npos ? std::from_chars(end, end, port)
                                                      : std::from_chars(v->data() + colon + 1, end, port);
    if (colon == std::string::npos || colon == 0 || ec != std::errc() || ptr != end || port < 1 || port > 65535)
      fail(kRecoveryStore, *v, "expected HOST:PORT (idist-run sets it)");
    c.recovery_host = v->substr(0, colon);
    c.recovery_port = port;
  }
  if (auto v = env.get(kReplacement); v && !v->empty()) {
    const auto at = v->find('@');
    int origin = -1;
    unsigned long long after = 0;
    const char* end = v->data() + v->size();
    const auto first = at == std::string::npos ? std::from_chars(end, end, origin)
                                               : std::from_chars(v->data(), v->data() + at, origin);
    const auto second = at == std::string::npos ? first : std::from_chars(v->data() + at + 1, end, after);
    if (at == std::string::npos || first.ec != std::errc() || first.ptr != v->data() + at || second.ec != std::errc() ||
        second.ptr != end || origin < 0)
      fail(kReplacement, *v, "expected ORIGIN@GENERATION (idist-run sets it)");
    if (c.recovery_host.empty())
      fail(kReplacement, *v, "a replacement needs IDIST_RECOVERY_STORE (idist-run sets both)");
    c.replacement_origin = origin;
    c.replacement_after = after;
  }
  // Empty counts as unset, as a shell's `IDIST_HIER_SEGMENT= prog` means.
  auto bytes = [&](std::string_view name, std::optional<std::size_t>& out, bool takes_off) {
    const auto v = env.get(name);
    if (!v || v->empty()) return;
    if (takes_off && *v == "off") {
      out = Contract::Tuning::kNever;
      return;
    }
    std::size_t n = 0;
    const auto [ptr, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
    if (ec != std::errc() || ptr != v->data() + v->size() || n == Contract::Tuning::kNever)
      fail(name, *v, takes_off ? "not a byte count (a whole number, as 65536) or off" : "not a byte count (a whole number, as 1048576)");
    out = n;
  };
  bytes(kUcxRingFrom, c.tuning.ucx_ring_from, false);
  bytes(kUcxTcpFrom, c.tuning.ucx_tcp_from, true);
  bytes(kHierSegment, c.tuning.hier_segment, false);
  bytes(kHierRailsFrom, c.tuning.hier_rails_from, false);

  const bool any_topology = env.get(kRank) || env.get(kWorldSize) || env.get(kLocalRank) ||
                            env.get(kLocalWorldSize) || env.get(kMasterAddr) || env.get(kMasterPort);
  if (!any_topology) {  // nothing set: a world of one, no store
    if (marks_describe_a_job(lookup))
      for (const auto& mark : launcher_marks(lookup)) c.unread_launcher += (c.unread_launcher.empty() ? "" : ", ") + mark;
    return c;
  }
  c.from_env = true;

  // RANK and WORLD_SIZE are what torch's env:// demands too; the rest has safe defaults.
  c.world_size = parse_int(kWorldSize, env.require(kWorldSize, "needed with RANK"), 1, kMaxRanks);
  c.rank = parse_int(kRank, env.require(kRank, "needed with WORLD_SIZE"), 0, c.world_size - 1);

  // Without LOCAL_* the job is taken to be on one node, as torch does.
  const auto local_world_size = env.get_int(kLocalWorldSize, 1, c.world_size);
  c.local_world_size = local_world_size.value_or(c.world_size);
  c.local_rank = env.get_int(kLocalRank, 0, kMaxRanks).value_or(c.rank % c.local_world_size);
  if (c.local_rank >= c.local_world_size)
    fail(kLocalRank, std::to_string(c.local_rank),
         "must be less than LOCAL_WORLD_SIZE=" + std::to_string(c.local_world_size));

  const auto node_rank = env.get_int(kNodeRank, 0, kMaxRanks);
  const auto group_rank = env.get_int(kGroupRank, 0, kMaxRanks);
  if (node_rank && group_rank && *node_rank != *group_rank)
    throw ContractError("NODE_RANK=" + std::to_string(*node_rank) + " and GROUP_RANK=" +
                        std::to_string(*group_rank) + " disagree");
  c.node_rank = node_rank ? *node_rank : group_rank.value_or(0);
  const int derived_nnodes = (c.world_size + c.local_world_size - 1) / c.local_world_size;
  c.nnodes = env.get_int(kGroupWorldSize, 1, c.world_size).value_or(derived_nnodes);
  if (c.node_rank >= c.nnodes)
    fail(kNodeRank, std::to_string(c.node_rank), "must be less than the node count " + std::to_string(c.nnodes));

  if (c.world_size > 1) {
    c.master_addr = env.require(kMasterAddr, "rank 0's host is needed when WORLD_SIZE > 1");
    if (c.master_addr.empty()) fail(kMasterAddr, c.master_addr, "empty host name");
    c.master_port = parse_int(kMasterPort, env.require(kMasterPort, "rank 0's port is needed when WORLD_SIZE > 1"),
                              1, 65535);
  } else {
    if (auto v = env.get(kMasterAddr); v && !v->empty()) c.master_addr = *v;
    // 0 is what to_variables() writes for a world of one that has no store.
    if (auto v = env.get(kMasterPort)) c.master_port = parse_int(kMasterPort, *v, 0, 65535);
  }
  return c;
}

std::vector<std::string> launcher_marks(const Lookup& lookup) {
  std::vector<std::string> out;
  for (const auto& mark : kLauncherMarks)
    if (auto v = lookup(mark.variable))
      out.push_back(std::string(mark.variable) + "=" + *v + " (" + std::string(mark.launcher) + ")");
  return out;
}

bool marks_describe_a_job(const Lookup& lookup) {
  bool any = false;
  std::optional<long long> size;
  for (const auto& mark : kLauncherMarks) {
    if (!lookup(mark.variable)) continue;
    any = true;
    if (mark.size.empty()) continue;
    const auto v = lookup(mark.size);
    if (!v) continue;
    long long n = 0;
    const auto [ptr, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
    if (ec == std::errc() && ptr == v->data() + v->size()) size = std::max(size.value_or(0), n);
  }
  return any && (!size || *size > 1);
}

std::vector<std::pair<std::string, std::string>> to_variables(const Contract& c) {
  std::vector<std::pair<std::string, std::string>> vars = {
      {std::string(kRank), std::to_string(c.rank)},
      {std::string(kWorldSize), std::to_string(c.world_size)},
      {std::string(kLocalRank), std::to_string(c.local_rank)},
      {std::string(kLocalWorldSize), std::to_string(c.local_world_size)},
      {std::string(kNodeRank), std::to_string(c.node_rank)},
      {std::string(kGroupRank), std::to_string(c.node_rank)},
      {std::string(kGroupWorldSize), std::to_string(c.nnodes)},
      {std::string(kMasterAddr), c.master_addr},
      {std::string(kMasterPort), std::to_string(c.master_port)},
      {std::string(kRestartCount), std::to_string(c.restart_count)},
  };
  auto add_if = [&](std::string_view name, const std::string& value) {
    if (!value.empty()) vars.emplace_back(std::string(name), value);
  };
  add_if(kBackend, c.backend);
  add_if(kLauncher, c.launcher);
  add_if(kRunId, c.run_id);
  add_if(kJobToken, c.job_token);
  if (c.timeout != kDefaultTimeout) {
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%.3f", static_cast<double>(c.timeout.count()) / 1000);
    vars.emplace_back(std::string(kTimeout), seconds);
  }
  return vars;
}

}  // namespace idist::env
