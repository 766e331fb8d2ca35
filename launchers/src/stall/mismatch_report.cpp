// Mismatched collectives, from the ranks' recorders: the calls made at one (group, number)
// compared, and, where the call itself has left the recorders, the histories leading to it.
#include <spdlog/fmt/fmt.h>
#include <spdlog/fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <string_view>
#include <tuple>

#include "call_words.hpp"
#include "stall_report.hpp"

namespace idist::launchers::detail {
namespace {

namespace rec = common::recorder;
using namespace call_words;

using CallKey = std::tuple<std::uint32_t, std::int32_t, std::uint64_t>;  // (epoch, group, number)
using Calls = std::vector<std::pair<const Recorded*, int>>;              // each call, and its rank

// A group whose mismatch has been said: its calls' histories differ from then on.
constexpr std::uint64_t kGroupSaid = ~std::uint64_t{0};

// What every mismatch line ends with.
constexpr std::string_view kWrongResults =
    "(a call that did not raise returned wrong results: shared memory raises where it would read such data, gloo "
    "over TCP and mpi do with IDIST_DEBUG=1)";

// The calls made at each (epoch, group, number), and by whom.
std::map<CallKey, Calls> calls_by_number(const std::vector<RankView>& ranks) {
  std::map<CallKey, Calls> at;
  for (const auto& r : ranks)
    for (const auto& s : r.slots)
      if (collective(s)) at[{s.epoch, s.group, s.seq}].push_back({&s, r.rank});
  // A shared-ring group's latest call, kept apart from the ring: compared by history alone, so
  // that a mismatch other calls pushed out of the ring is still seen at the job's end.
  for (const auto& r : ranks)
    for (const auto& s : r.slots)
      if (s.kind == rec::Kind::member && s.has_call) {
        auto& calls = at[{s.epoch, s.group, s.seq}];
        const bool recorded = std::any_of(calls.begin(), calls.end(), [&](const auto& c) { return c.second == r.rank; });
        if (!recorded) calls.push_back({&s, r.rank});
      }
  return at;
}

// Each group's ranks, by the records they have of it.
std::map<std::pair<std::uint32_t, std::int32_t>, std::set<int>> members_of(const std::vector<RankView>& ranks) {
  std::map<std::pair<std::uint32_t, std::int32_t>, std::set<int>> members;
  for (const auto& r : ranks)
    for (const auto& s : r.slots)
      if (collective(s) || s.kind == rec::Kind::member) members[{s.epoch, s.group}].insert(r.rank);
  return members;
}

// The calls, each with its ranks, in the order first seen.
std::vector<std::pair<const Recorded*, std::vector<int>>> kinds_of(const Calls& calls) {
  std::vector<std::pair<const Recorded*, std::vector<int>>> kinds;
  for (const auto& [call, rank] : calls) {
    if (!collective(*call)) continue;  // a member's latest call: its history only
    auto same = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return same_call(*k.first, *call); });
    if (same == kinds.end()) {
      kinds.push_back({call, {rank}});
    } else if (std::find(same->second.begin(), same->second.end(), rank) == same->second.end()) {
      same->second.push_back(rank);
    }
  }
  return kinds;
}

// The same call at this number, but not the same calls before it: a mismatch whose call has
// left the recorder (the ranks went on for a whole ring since); "" when the histories agree.
std::string history_line(const Calls& calls, std::int32_t group, std::uint64_t seq) {
  std::vector<std::pair<std::uint64_t, std::vector<int>>> histories;
  for (const auto& [call, rank] : calls) {
    auto same = std::find_if(histories.begin(), histories.end(), [&](const auto& h) { return h.first == call->history; });
    if (same == histories.end()) same = histories.insert(histories.end(), {call->history, {}});
    if (std::find(same->second.begin(), same->second.end(), rank) == same->second.end()) same->second.push_back(rank);
  }
  if (histories.size() < 2) return "";
  std::vector<std::string> sides;
  for (auto& [history, who] : histories) {
    std::sort(who.begin(), who.end());
    sides.push_back(list(who));
  }
  const auto seen = std::find_if(calls.begin(), calls.end(), [](const auto& c) { return collective(*c.first); });
  return fmt::format("mismatch: collective #{} on group {}: {}the ranks' calls up to it did not match ({}), and the "
                     "call that differed has left the recorder {}",
                     seq, group_name(group),
                     seen == calls.end() ? "" : "every rank called " + what(*seen->first) + ", but ",
                     fmt::join(sides, " against "), kWrongResults);
}

// Different calls at this number: who called what.
std::string kinds_line(std::vector<std::pair<const Recorded*, std::vector<int>>>& kinds, std::int32_t group,
                       std::uint64_t seq) {
  std::vector<std::string> parts;
  const bool ops_differ = std::any_of(kinds.begin(), kinds.end(),
                                      [&](const auto& k) { return k.first->reduce != kinds.front().first->reduce; });
  for (auto& [call, who] : kinds) {
    std::sort(who.begin(), who.end());
    parts.push_back(fmt::format("{} called {}", list(who), what(*call, ops_differ)));
  }
  return fmt::format("mismatch: collective #{} on group {}: {}; the ranks' calls must match {}", seq, group_name(group),
                     fmt::join(parts, ", "), kWrongResults);
}

}  // namespace

std::vector<std::string> mismatch_report(const std::vector<RankView>& ranks, CallKeys& reported,
                                         HeldMismatches* held, bool running) {
  const auto at = calls_by_number(ranks);
  auto members = members_of(ranks);
  std::vector<std::string> lines;
  auto said = [&](const CallKey& key, std::string line) {
    reported.insert(key);
    reported.insert({std::get<0>(key), std::get<1>(key), kGroupSaid});
    lines.push_back(std::move(line));
  };
  for (const auto& [key, calls] : at) {
    const auto [epoch, group, seq] = key;
    if (reported.count({epoch, group, seq}) != 0) continue;
    // Not every rank of the group here yet: on the next read (once).
    const auto& all = members[{epoch, group}];
    const bool everyone = std::all_of(all.begin(), all.end(), [&](int rank) {
      return std::any_of(calls.begin(), calls.end(), [&](const auto& c) { return c.second == rank; });
    });
    // Said now, or held until the next read when some rank of the group has yet to reach it
    // (then said as it is then, or as it was, if the call has left the recorders since).
    const auto say = [&, &key = key](std::string line) {
      if (running && held != nullptr && !everyone && held->emplace(key, line).second) return;
      if (held != nullptr) held->erase(key);
      said(key, std::move(line));
    };
    auto kinds = kinds_of(calls);
    if (kinds.size() >= 2) {
      say(kinds_line(kinds, group, seq));
    } else if (reported.count({epoch, group, kGroupSaid}) == 0) {  // said once per group
      if (auto line = history_line(calls, group, seq); !line.empty()) say(std::move(line));
    }
  }
  // Held at an earlier read, and gone from the recorders since: as it was then.
  if (held != nullptr) {
    for (auto it = held->begin(); it != held->end();) {
      if (at.count(it->first) != 0) {
        ++it;
        continue;
      }
      if (reported.count(it->first) == 0) said(it->first, it->second);
      it = held->erase(it);
    }
  }
  return lines;
}

}  // namespace idist::launchers::detail
