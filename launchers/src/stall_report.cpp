#include "stall_report.hpp"

#include <spdlog/fmt/fmt.h>
#include <spdlog/fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <map>
#include <tuple>
#include <sstream>

namespace idist::launchers::detail {
namespace {

namespace rec = common::recorder;

constexpr std::array<const char*, 8> kDTypeNames = {"int8",    "uint8",    "int32",   "int64",
                                                    "float16", "bfloat16", "float32", "float64"};

std::string dtype_name(std::uint8_t d) { return d < kDTypeNames.size() ? kDTypeNames[d] : "dtype " + std::to_string(d); }

std::string group_name(std::int32_t g) { return g < 0 ? "world" : "new_group #" + std::to_string(g); }

std::string seconds(std::int64_t ns) { return fmt::format("{:.1f} s", static_cast<double>(ns) / 1e9); }

// Its arguments: "float32, 2 elements, root 0"; "" for a barrier.
std::string details(const Recorded& r) {
  if (r.op == "barrier") return "";
  std::string out = fmt::format("{}, {} element{}", dtype_name(r.dtype), r.count, r.count == 1 ? "" : "s");
  if (r.root >= 0) out += fmt::format(", root {}", r.root);
  return out;
}

// What a call was: "all_reduce (float32, 2 elements)", "barrier".
std::string what(const Recorded& r) {
  const auto d = details(r);
  return d.empty() ? r.op : r.op + " (" + d + ")";
}

bool same_call(const Recorded& a, const Recorded& b) {
  return a.op == b.op && a.dtype == b.dtype && a.count == b.count && a.root == b.root;
}

std::string list(const std::vector<int>& ranks) {
  return fmt::format("rank{} {}", ranks.size() == 1 ? "" : "s", fmt::join(ranks, ", "));
}

}  // namespace

std::vector<Recorded> read_recorder(const rec::Segment& segment, std::int64_t since_ns) {
  std::vector<Recorded> out;
  if (segment.magic != rec::kMagic) return out;
  for (const auto& slot : segment.slots) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      const auto before = slot.version.load(std::memory_order_acquire);
      if (before & 1) continue;
      Recorded r;
      r.state = static_cast<rec::State>(slot.state.load(std::memory_order_acquire));
      r.op.assign(slot.op, strnlen(slot.op, sizeof(slot.op)));
      r.dtype = slot.dtype;
      r.epoch = slot.epoch;
      r.group = slot.group;
      r.root = slot.root;
      r.seq = slot.seq;
      r.count = slot.count;
      std::atomic_thread_fence(std::memory_order_acquire);
      if (slot.version.load(std::memory_order_relaxed) != before) continue;
      r.entered_ns = since_ns;
      if (r.state != rec::State::empty) out.push_back(std::move(r));
      break;
    }
  }
  return out;
}

std::string process_state(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return "gone";
  std::ifstream wchan_file("/proc/" + std::to_string(pid) + "/wchan");
  std::string wchan;
  std::getline(wchan_file, wchan);
  const std::string in = wchan.empty() || wchan == "0" ? "" : " in " + wchan;
  switch (text[close + 2]) {
    case 'R': return "running (on a core, or ready for one)";
    case 'S': return "sleeping" + in;
    case 'D': return "in uninterruptible sleep" + in;
    case 'T': return "stopped (SIGSTOP or SIGTSTP)";
    case 't': return "stopped by a debugger";
    case 'Z': return "exited, not yet reaped";
    default: return std::string("state ") + text[close + 2];
  }
}

std::optional<std::vector<std::string>> stall_report(const std::vector<RankView>& ranks, std::int64_t now_ns,
                                                     std::chrono::milliseconds stall,
                                                     CallKeys& reported) {
  const auto stall_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(stall).count();
  // The collective waited in longest, by any running rank.
  const Recorded* oldest = nullptr;
  for (const auto& r : ranks) {
    if (!r.running) continue;
    for (const auto& s : r.slots)
      if (s.state == rec::State::entered && now_ns - s.entered_ns >= stall_ns &&
          (oldest == nullptr || s.entered_ns < oldest->entered_ns))
        oldest = &s;
  }
  if (oldest == nullptr) return std::nullopt;
  const Recorded ref = *oldest;
  if (!reported.insert({ref.epoch, ref.group, ref.seq}).second) return std::nullopt;

  std::vector<int> waiting;
  std::int64_t longest = 0;
  std::vector<std::string> others;
  for (const auto& r : ranks) {
    const Recorded* at = nullptr;     // its call with this number in the group
    const Recorded* last = nullptr;   // its latest call in the group
    const Recorded* done = nullptr;   // its latest completed call in the group
    for (const auto& s : r.slots) {
      if (s.group != ref.group || s.epoch != ref.epoch) continue;
      if (s.seq == ref.seq) at = &s;
      if (last == nullptr || s.seq > last->seq) last = &s;
      if (s.state == rec::State::completed && (done == nullptr || s.seq > done->seq)) done = &s;
    }
    // Sub-groups: a rank that never called into the group is taken for a non-member.
    if (ref.group >= 0 && last == nullptr) continue;
    const std::string process = r.running ? "state: " + process_state(r.pid) : r.ended;
    if (at != nullptr && same_call(*at, ref) && at->state == rec::State::entered && r.running) {
      waiting.push_back(r.rank);
      longest = std::max(longest, now_ns - at->entered_ns);
      continue;
    }
    if (at != nullptr && !same_call(*at, ref)) {
      others.push_back(fmt::format("rank {} called {} as #{} instead: the ranks' calls do not match", r.rank, what(*at),
                                   ref.seq));
      continue;
    }
    if (at != nullptr && at->state == rec::State::completed) {
      others.push_back(fmt::format("rank {} completed it ({})", r.rank, process));
      continue;
    }
    if (at != nullptr) {
      others.push_back(fmt::format("rank {} {} in it ({})", r.rank, at->state == rec::State::failed ? "failed" : "entered it but", process));
      continue;
    }
    const std::string before =
        done != nullptr ? fmt::format("last completed: {} #{}", done->op, done->seq)
                        : std::string("no collective completed in this group yet");
    if (last != nullptr && last->seq > ref.seq) {
      others.push_back(fmt::format("rank {} is past it, at {} #{} ({}; {})", r.rank, last->op, last->seq, before, process));
    } else {
      others.push_back(fmt::format("rank {} never entered it ({}; {})", r.rank, before, process));
    }
  }
  std::vector<std::string> lines;
  const auto d = details(ref);
  std::string head = fmt::format("stall: {} #{} on group {}{}: {} waiting {}", ref.op, ref.seq, group_name(ref.group),
                                 d.empty() ? "" : " (" + d + ")", list(waiting), seconds(longest));
  if (others.empty()) {
    head += "; every rank here entered it, so the backend or the network holds it (a cut link, a rank on another "
            "node that never came)";
    lines.push_back(std::move(head));
  } else {
    lines.push_back(head + "; " + others.front());
    for (std::size_t i = 1; i < others.size(); ++i) lines.push_back("stall: ... " + others[i]);
  }
  return lines;
}

std::vector<std::string> mismatch_report(const std::vector<RankView>& ranks,
                                         CallKeys& reported) {
  // (epoch, group, number) -> the calls made at it, and by whom.
  std::map<std::tuple<std::uint32_t, std::int32_t, std::uint64_t>, std::vector<std::pair<const Recorded*, int>>> at;
  for (const auto& r : ranks)
    for (const auto& s : r.slots) at[{s.epoch, s.group, s.seq}].push_back({&s, r.rank});
  std::vector<std::string> lines;
  for (const auto& [key, calls] : at) {
    const auto [epoch, group, seq] = key;
    if (reported.count({epoch, group, seq}) != 0) continue;
    // The calls, each with its ranks, in the order first seen.
    std::vector<std::pair<const Recorded*, std::vector<int>>> kinds;
    for (const auto& [call, rank] : calls) {
      auto same = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return same_call(*k.first, *call); });
      if (same == kinds.end()) {
        kinds.push_back({call, {rank}});
      } else if (std::find(same->second.begin(), same->second.end(), rank) == same->second.end()) {
        same->second.push_back(rank);
      }
    }
    if (kinds.size() < 2) continue;
    reported.insert({epoch, group, seq});
    std::vector<std::string> parts;
    for (auto& [call, who] : kinds) {
      std::sort(who.begin(), who.end());
      parts.push_back(fmt::format("{} called {}", list(who), what(*call)));
    }
    lines.push_back(fmt::format("mismatch: collective #{} on group {}: {}; the ranks' calls must match (a call that "
                                "did not raise returned wrong results: shared memory raises on every rank, gloo over "
                                "TCP and mpi do with IDIST_DEBUG=1)",
                                seq, group_name(group), fmt::join(parts, ", ")));
  }
  return lines;
}

}  // namespace idist::launchers::detail
