// The join: every rank announces itself (its host, its settings) before the world connects;
// rank 0 numbers the hosts and machines and hands every rank the table, or refuses the job
// where settings differ, or names who never came (init, and each live-recovery generation).
#include <spdlog/fmt/fmt.h>

#include "runtime.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/cpus_shared.hpp"
#include "common/duration.hpp"
#include "common/wait.hpp"
#include "idist/common/host.hpp"
#include "store_keys.hpp"

namespace idist::detail {
using namespace store_keys;

namespace {

using Clock = std::chrono::steady_clock;

// The first byte of rank 0's verdict at the join when it refuses the job's settings.
constexpr char kRefused = '!';

// "node 1 never joined; missing ranks 4, 5, 6, 7 (4 of 8)". Nodes are named from the nodes
// that reported in, so the answer is right whatever the placement (cyclic included).
std::string describe_missing(const std::vector<bool>& ranks, const std::vector<bool>& nodes) {
  constexpr std::size_t kShown = 8;
  auto list = [](const std::vector<bool>& present, std::size_t& missing) {
    std::string out;
    std::size_t shown = 0;
    for (std::size_t i = 0; i < present.size(); ++i) {
      if (present[i]) continue;
      if (++missing > kShown) continue;
      out += (shown++ ? ", " : "") + std::to_string(i);
    }
    if (missing > kShown) out += ", ...";
    return out;
  };
  std::size_t missing_nodes = 0;
  std::size_t missing_ranks = 0;
  const auto node_list = list(nodes, missing_nodes);
  const auto rank_list = list(ranks, missing_ranks);
  if (missing_ranks == 0) return "every rank has joined by now";
  std::string out;
  if (missing_nodes > 0) out = (missing_nodes == 1 ? "node " : "nodes ") + node_list + " never joined; ";
  return out + "missing rank" + (missing_ranks == 1 ? " " : "s ") + rank_list + " (" + std::to_string(missing_ranks) +
         " of " + std::to_string(ranks.size()) + ")";
}

// Hosts are numbered densely in the order they are first met: `value`'s number, adding it to
// `seen` when new.
template <class T>
int number_of(std::vector<T>& seen, const T& value) {
  auto it = std::find(seen.begin(), seen.end(), value);
  if (it == seen.end()) it = seen.insert(seen.end(), value);
  return static_cast<int>(it - seen.begin());
}

// The machine a host identity runs on (common::host_identity: "NAME BOOT_ID PID_NS", read from
// the end: a name may hold a space): fake hosts (namespaces, containers) of one machine share its
// cpus. Without a boot id, the host is its own machine.
std::string machine_of(const std::string& identity) {
  const auto last = identity.rfind(' ');
  const auto before = last == std::string::npos || last == 0 ? std::string::npos : identity.rfind(' ', last - 1);
  if (before == std::string::npos) return identity;
  const auto boot = identity.substr(before + 1, last - before - 1);
  return boot == "no-boot-id" ? identity : boot;
}

// The table rank 0 hands every rank: hosts[r], then machines[r], as 32-bit numbers.
std::vector<char> encode_table(const std::vector<int>& hosts, const std::vector<int>& machines) {
  std::vector<int> all = hosts;
  all.insert(all.end(), machines.begin(), machines.end());
  std::vector<char> out(all.size() * sizeof(std::int32_t));
  for (std::size_t r = 0; r < all.size(); ++r) {
    const auto h = static_cast<std::int32_t>(all[r]);
    std::memcpy(out.data() + r * sizeof(h), &h, sizeof(h));
  }
  return out;
}

struct HostTable {
  std::vector<int> hosts, machines;
};

// The waits yield where this job's ranks on this rank's machine (fake hosts of one machine
// included) outnumber its cores: they wait for each other, and a spinner would keep its core
// from the very rank it waits for (common/cpus_shared.hpp).
void follow_machine(const env::Contract& c, const std::vector<int>& machines) {
  const auto mine = machines[static_cast<std::size_t>(c.rank)];
  follow_cpus_shared(c, static_cast<int>(std::count(machines.begin(), machines.end(), mine)));
}

HostTable decode_table(const std::vector<char>& bytes, int world_size) {
  const auto n = static_cast<std::size_t>(world_size);
  if (bytes.size() != 2 * n * sizeof(std::int32_t))
    throw std::runtime_error("rank 0's table of hosts has " + std::to_string(bytes.size()) + " bytes, not " +
                             std::to_string(world_size * 8) + ": do all ranks run the same idist?");
  HostTable table{std::vector<int>(n), std::vector<int>(n)};
  for (std::size_t r = 0; r < 2 * n; ++r) {
    std::int32_t h = 0;
    std::memcpy(&h, bytes.data() + r * sizeof(h), sizeof(h));
    (r < n ? table.hosts[r] : table.machines[r - n]) = h;
  }
  return table;
}

// The choices both ends of a message follow, as "NAME=VALUE" lines: where ranks differ, a
// message goes one way on one end and another way on the other, which shows up as a timeout or
// a size error far from its cause. So rank 0 compares them at the join.
constexpr std::string_view kLiveRecovery = "live recovery";

}  // namespace

std::string agreed_settings(const env::Contract& c, const std::string& backend, bool recovery) {
  const auto bytes = [](const std::optional<std::size_t>& v) {
    return !v ? std::string("unset") : *v == env::Contract::Tuning::kNever ? std::string("off") : std::to_string(*v);
  };
  // Live recovery first: where it differs, the transport between hosts differs with it.
  const auto live = !recovery ? "off" : c.recovery_host.empty() ? "not offered by idist-run" : "on";
  return fmt::format("backend={}\n{}={}\n{}={}\n{}={}\n{}={}\n{}={}\n{}={}\n{}={}\n{}={}", backend, kLiveRecovery,
                     live, env::kIntranode, c.intranode, env::kInterhost, c.interhost, env::kDebug, c.debug ? 1 : 0,
                     env::kUcxRingFrom, bytes(c.tuning.ucx_ring_from), env::kUcxTcpFrom, bytes(c.tuning.ucx_tcp_from),
                     env::kHierSegment, bytes(c.tuning.hier_segment), env::kHierRailsFrom,
                     bytes(c.tuning.hier_rails_from));
}

// Live recovery aborts a lost peer's connections (Backend::abort), which UCX cannot: between
// hosts its traffic goes over gloo's TCP instead, which can (docs/RECOVERY.md). Said where
// the user asked for UCX by name.
void recovery_carriers(env::Contract& c, const ErrorSite& site) {
  if (c.recovery_host.empty()) return;  // no idist-run offers it: nothing will abort
  if (c.local_world_size == c.world_size) return;  // one host: nothing goes between hosts
  if (c.interhost == "ucx")
    throw Error(site, "live recovery (InitOptions::recovery) cannot abort UCX's connections to a lost rank: unset "
                      "IDIST_INTERHOST=ucx (or set it to gloo), or run without recovery");
  c.interhost = "gloo";
}

namespace {

// The first line where `theirs` (rank `rank`'s) differs from rank 0's `ours`, as one sentence
// that says what to do; empty where they agree.
std::string settings_difference(const std::string& ours, const std::string& theirs, int rank) {
  if (ours == theirs) return {};
  const auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    for (std::size_t at = 0; at <= text.size();) {
      const auto end = std::min(text.find('\n', at), text.size());
      out.push_back(text.substr(at, end - at));
      at = end + 1;
    }
    return out;
  };
  const auto mine = lines(ours), other = lines(theirs);
  for (std::size_t i = 0; i < std::max(mine.size(), other.size()); ++i) {
    const auto a = i < mine.size() ? mine[i] : std::string("?="), b = i < other.size() ? other[i] : std::string("?=");
    if (a == b) continue;
    const auto name = a.substr(0, a.find('='));
    const auto value = [](const std::string& line) { return line.substr(line.find('=') + 1); };
    if (name == kLiveRecovery)
      return fmt::format("ranks disagree on live recovery: {} on rank {} but {} on rank 0; every rank must call "
                         "init() with InitOptions::recovery alike, and every node's idist-run run with the same "
                         "--recovery",
                         value(b), rank, value(a));
    if (name == "backend")
      return fmt::format("ranks disagree on the backend: {} on rank {} but {} on rank 0; every rank must call init() "
                         "with the same backend (and IDIST_BACKEND, where set, must be the same for all)",
                         value(b), rank, value(a));
    return fmt::format("ranks disagree on {}: {} on rank {} but {} on rank 0; set it alike for every rank, or unset "
                       "it everywhere",
                       name, value(b), rank, value(a));
  }
  return "ranks disagree on their settings: do all ranks run the same idist?";
}

}  // namespace

std::vector<int> Runtime::hosts_of(const std::vector<int>& ranks) const {
  if (hosts_.empty()) return {};
  std::vector<int> seen;  // world host numbers, in the order the group meets them
  std::vector<int> out;
  for (int r : ranks) out.push_back(number_of(seen, hosts_[static_cast<std::size_t>(r)]));
  return out;
}

namespace {

// A rank other than 0 at the join: rank 0's verdict, by `until`. The table of hosts where
// everyone came with the same settings; else throws what rank 0 found, having acknowledged it.
HostTable join_verdict(Store& store, const std::string& prefix, const env::Contract& c, Clock::time_point until,
                       const std::string& waited) {
  const std::string result_key = prefix + "result";
  try {
    store.wait({result_key}, remaining(until));
  } catch (const TimeoutFailure&) {
    throw TimeoutFailure(waited + "rank 0 never reported who was missing");
  }
  const auto verdict = store.get(result_key);
  if (verdict.empty()) return decode_table(store.get(prefix + "hosts"), c.world_size);
  store.set(prefix + "ack/" + std::to_string(c.rank), {});
  // A verdict that starts with kRefused: everyone came, but not with the same settings.
  if (verdict.front() == kRefused) throw std::runtime_error(std::string(verdict.begin() + 1, verdict.end()));
  throw TimeoutFailure(waited + std::string(verdict.begin(), verdict.end()));
}

// Rank 0, its join timed out: the timed-out connection is closed; a fresh one to our own
// server finds out who came, tells them, and gives them a moment to read it before the store
// goes away with us. Returns what it told them.
std::string tell_who_is_missing(Store& probe, const env::Contract& c, const std::string& prefix,
                                const std::vector<std::string>& rank_keys) {
  const auto ranks = check_all(probe, rank_keys);
  const auto verdict = describe_missing(ranks, check_all(probe, numbered_keys(prefix + "node/", c.nnodes)));
  probe.set(prefix + "result", {verdict.begin(), verdict.end()});
  std::vector<std::string> acks;
  for (int r = 1; r < c.world_size; ++r)
    if (ranks[static_cast<std::size_t>(r)]) acks.push_back(prefix + "ack/" + std::to_string(r));
  try {
    wait_all(probe, acks, Clock::now() + std::chrono::seconds(2));
  } catch (const std::exception&) {
    // They had their chance; rank 0's own error is what matters now.
  }
  return verdict;
}

}  // namespace

void Runtime::join(Clock::time_point deadline, const std::string& settings) {
  const std::string prefix = std::string(kWorldPrefix) + "joined/";
  const std::string result_key = prefix + "result";
  const std::string hosts_key = prefix + "hosts";
  const auto& c = contract_;
  // Each rank says where it runs; rank 0 numbers the hosts and hands every rank the table.
  // "IDENTITY\nSETTINGS": a host's identity holds no newline.
  const auto announced = common::host_identity() + "\n" + settings;
  store_->set(prefix + "rank/" + std::to_string(c.rank), std::vector<char>(announced.begin(), announced.end()));
  store_->set(prefix + "node/" + std::to_string(c.node_rank), {});
  const std::string waited =
      timed_out("joining", c.timeout, fmt::format("waiting for all {} ranks: ", c.world_size));
  constexpr auto kMargin = std::chrono::seconds(5);  // for rank 0 to find out who is missing and say so

  if (c.rank != 0) {
    // Only rank 0 waits for everyone (N keys, not N^2); the others wait for its verdict.
    auto table = join_verdict(*store_, prefix, c, deadline + kMargin, waited);
    hosts_ = std::move(table.hosts);
    return follow_machine(c, table.machines);
  }

  const auto rank_keys = numbered_keys(prefix + "rank/", c.world_size);
  try {
    wait_all(*store_, rank_keys, deadline);
    std::vector<std::string> identities, machine_ids;
    std::vector<int> machines;
    std::string refused;
    for (int r = 0; r < c.world_size; ++r) {
      const auto value = store_->get(rank_keys[static_cast<std::size_t>(r)]);
      const std::string text(value.begin(), value.end());
      const auto newline = std::min(text.find('\n'), text.size());
      hosts_.push_back(number_of(identities, text.substr(0, newline)));
      machines.push_back(number_of(machine_ids, machine_of(text.substr(0, newline))));
      if (refused.empty()) refused = settings_difference(settings, text.substr(std::min(newline + 1, text.size())), r);
    }
    if (refused.empty()) {
      store_->set(hosts_key, encode_table(hosts_, machines));
      store_->set(result_key, {});
      return follow_machine(c, machines);
    }
    // Everyone is here, so everyone hears why, before the store goes away with rank 0.
    const auto verdict = kRefused + refused;
    store_->set(result_key, {verdict.begin(), verdict.end()});
    auto acks = numbered_keys(prefix + "ack/", c.world_size);
    acks.erase(acks.begin());  // rank 0's own
    try {
      wait_all(*store_, acks, Clock::now() + std::chrono::seconds(2));
    } catch (const std::exception&) {
      // They had their chance; the refusal is what matters.
    }
    throw std::runtime_error(refused);
  } catch (const TimeoutFailure& e) {
    std::string verdict;
    try {
      verdict = tell_who_is_missing(*probe(std::chrono::seconds(2)), c, prefix, rank_keys);
    } catch (const std::exception&) {
      throw TimeoutFailure(waited + e.what());
    }
    throw TimeoutFailure(waited + verdict);
  }
}
}  // namespace idist::detail
