#include "stall_report.hpp"

#include "idist/common/duration.hpp"
#include "idist/types.hpp"

#include <spdlog/fmt/fmt.h>
#include <spdlog/fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <tuple>
#include <sstream>
#include <string_view>

namespace idist::launchers::detail {
namespace {

namespace rec = common::recorder;

constexpr std::array<const char*, 8> kDTypeNames = {"int8",    "uint8",    "int32",   "int64",
                                                    "float16", "bfloat16", "float32", "float64"};

std::string dtype_name(std::uint8_t d) { return d < kDTypeNames.size() ? kDTypeNames[d] : "dtype " + std::to_string(d); }

// idist::to_string(ReduceOp)'s names: that function is libidist's, which idist-run does not
// link (it starts ranks, it runs no collective); the assert keeps the two from parting.
constexpr std::array<const char*, 8> kReduceNames = {"SUM", "PRODUCT", "MIN", "MAX", "AND", "OR", "XOR", "AVG"};
static_assert(kReduceNames.size() == static_cast<std::size_t>(ReduceOp::AVG) + 1, "a name for every ReduceOp");

std::string reduce_name(std::uint8_t r) { return r < kReduceNames.size() ? kReduceNames[r] : "op " + std::to_string(r); }

std::string group_name(std::int32_t g) { return g < 0 ? "world" : "new_group #" + std::to_string(g); }

std::string seconds(std::int64_t ns) { return fmt::format("{:.1f} s", static_cast<double>(ns) / 1e9); }

// Its arguments: "float32, 2 elements, root 0", "float32 MAX, 2 elements"; "" for a barrier.
// SUM, the default, is named only with `with_sum` (ranks that differ in the op).
std::string details(const Recorded& r, bool with_sum = false) {
  if (r.op == "barrier") return "";
  // All ones: a count told at run time (an all_gather of each rank's own part, a broadcast
  // whose size goes first).
  std::string out = dtype_name(r.dtype);
  if ((r.reduce != 0 || with_sum) && r.op.find("reduce") != std::string::npos) out += " " + reduce_name(r.reduce);
  out += r.count != ~std::uint64_t{0} ? fmt::format(", {} element{}", r.count, r.count == 1 ? "" : "s")
         : r.op == "all_gather"       ? ", each rank's own count"
                                      : ", its count sent first";
  if (r.root >= 0) out += fmt::format(", root {}", r.root);
  return out;
}

// What a call was: "all_reduce (float32, 2 elements)", "barrier".
std::string what(const Recorded& r, bool with_sum = false) {
  const auto d = details(r, with_sum);
  return d.empty() ? r.op : r.op + " (" + d + ")";
}

bool collective(const Recorded& s) { return s.kind == rec::Kind::collective; }

// A send or recv the rank is blocked in: isend and irecv stay open while the rank goes on
// with its own work, so an open one says nothing of where the rank is.
bool blocked_in_p2p(const Recorded& s) {
  return !collective(s) && s.state == rec::State::entered && (s.op == "send" || s.op == "recv");
}

// Its process state: read on its node (another node's ranks carry theirs), with the node named.
std::string state_of(const RankView& r) {
  if (r.host.empty()) return process_state(r.pid);
  return r.process + " on " + r.host;
}

// "all_reduce #5 on world (float32, 2 elements)"; "recv from rank 2 on world (tag 0, 8 bytes)".
std::string call_text(const Recorded& r) {
  if (!collective(r)) {
    const bool sends = r.op == "send" || r.op == "isend";
    return fmt::format("{} {} rank {} on {} (tag {}, {} bytes)", r.op, sends ? "to" : "from", r.root,
                       group_name(r.group), r.seq, r.count);
  }
  const auto d = details(r);
  return fmt::format("{} #{} on {}{}", r.op, r.seq, group_name(r.group), d.empty() ? "" : " (" + d + ")");
}

const Recorded* newest_of(const RankView& r) {
  const Recorded* newest = nullptr;
  for (const auto& s : r.slots)
    if (s.kind != rec::Kind::member && (newest == nullptr || s.position > newest->position)) newest = &s;
  return newest;
}

// Where a rank is, by its newest call: in it (for how long), or in its own code after it.
// The reader dates a call by when it first saw it (see flight_recorder.hpp).
std::string where_is(const RankView& r, std::int64_t now_ns) {
  const Recorded* newest = newest_of(r);
  if (newest == nullptr) return "no call recorded yet";
  const auto since = seconds(now_ns - newest->entered_ns);
  if (newest->state == rec::State::entered && (collective(*newest) || blocked_in_p2p(*newest)))
    return fmt::format("in {} for {}", call_text(*newest), since);
  if (newest->state == rec::State::entered)  // an isend or irecv it goes on past
    return fmt::format("in its own code, {} posted {} ago", call_text(*newest), since);
  return fmt::format("in its own code, after {} ({} {} ago)", call_text(*newest),
                     newest->state == rec::State::failed ? "failed; entered" : "entered", since);
}

// The key a point-to-point stall is reported once under: no real epoch is this high.
constexpr std::uint32_t kP2pKey = 0xffffffff;

// A running rank whose newest call is a send or recv it has waited in for `stall_ns`: what it
// waits for and where its peer is (peers are group ranks: named only for the world's calls).
std::optional<StallReport> p2p_stall(const std::vector<RankView>& ranks, std::int64_t now_ns, std::int64_t stall_ns,
                                     CallKeys& reported) {
  for (const auto& r : ranks) {
    const Recorded* newest = newest_of(r);
    if (!r.running || newest == nullptr || !blocked_in_p2p(*newest) || now_ns - newest->entered_ns < stall_ns)
      continue;
    if (!reported.insert({kP2pKey, r.rank, newest->id}).second) continue;
    StallReport report;
    std::string line = fmt::format("stall: rank {} waiting {} in {}", r.rank, seconds(now_ns - newest->entered_ns),
                                   call_text(*newest));
    const RankView* peer = nullptr;
    if (newest->group < 0)
      for (const auto& other : ranks)
        if (other.rank == newest->root) peer = &other;
    if (peer != nullptr) {
      line += fmt::format("; rank {} is {} ({})", peer->rank, where_is(*peer, now_ns),
                          peer->running ? "state: " + state_of(*peer) : peer->ended);
      report.suspect = peer->rank;
      if (peer->running) report.to_inspect.push_back({peer->rank, peer->pid});
    } else {
      line += newest->group < 0 ? fmt::format("; rank {} runs on another node", newest->root) : "";
      report.suspect = r.rank;
    }
    report.to_inspect.push_back({r.rank, r.pid});
    report.lines.push_back(std::move(line));
    return report;
  }
  return std::nullopt;
}

bool same_call(const Recorded& a, const Recorded& b) {
  return a.op == b.op && a.dtype == b.dtype && a.count == b.count && a.root == b.root && a.reduce == b.reduce;
}

std::string list(const std::vector<int>& ranks) {
  return fmt::format("rank{} {}", ranks.size() == 1 ? "" : "s", fmt::join(ranks, ", "));
}

// The process states of some ranks, each as "state: sleeping" or "exited with code 3": one
// when they are all the same, else each with its rank, a few at most.
std::string states_of(const std::vector<std::pair<int, std::string>>& ranks) {
  const bool same = std::all_of(ranks.begin(), ranks.end(), [&](const auto& r) { return r.second == ranks.front().second; });
  if (same) return ranks.empty() ? "" : ranks.front().second;
  constexpr std::size_t kMost = 4;
  std::vector<std::string> each;
  for (std::size_t i = 0; i < ranks.size() && i < kMost; ++i)
    each.push_back(fmt::format("rank {} {}", ranks[i].first, ranks[i].second));
  if (ranks.size() > kMost) each.push_back(fmt::format("and {} more", ranks.size() - kMost));
  return fmt::format("{}", fmt::join(each, "; "));
}

}  // namespace

std::vector<Recorded> read_recorder(const rec::Segment& segment, std::int64_t since_ns) {
  std::vector<Recorded> out;
  if (segment.magic != rec::kMagic) return out;
  // A program of the rank that has ended (the rank's script went on to the next) waits in
  // nothing: a call it left open (killed in it) ended with it.
  std::map<std::uint32_t, bool> ended;
  auto life_ended = [&](std::uint32_t epoch) {
    const std::uint32_t life = epoch >> 16;
    const auto known = ended.find(life);
    if (known != ended.end()) return known->second;
    const auto entry = segment.life_pids[life % rec::kLives].load(std::memory_order_acquire);
    const auto pid = static_cast<pid_t>(entry & 0xffffffff);
    const bool gone = (entry >> 32) != life || pid <= 0 || (::kill(pid, 0) != 0 && errno == ESRCH);
    return ended[life] = gone;
  };
  for (std::uint64_t ring_index = 0; ring_index < rec::kRings; ++ring_index) {
    for (const auto& slot : segment.rings[ring_index].slots) {
      for (int attempt = 0; attempt < 3; ++attempt) {
        const auto before = slot.version.load(std::memory_order_acquire);
        if (before & 1) continue;
        Recorded r;
        r.state = static_cast<rec::State>(slot.state.load(std::memory_order_acquire));
        r.op = rec::op_name(static_cast<rec::Op>(slot.op));
        r.dtype = slot.dtype;
        r.kind = static_cast<rec::Kind>(slot.kind);
        r.epoch = slot.epoch;
        r.group = slot.group;
        r.root = slot.root;
        r.reduce = slot.reduce;
        r.seq = slot.seq;
        r.count = slot.count;
        r.position = slot.order;
        r.history = slot.history;
        r.id = ring_index << 56 | (slot.number.load(std::memory_order_relaxed) & ((std::uint64_t{1} << 56) - 1));
        std::atomic_thread_fence(std::memory_order_acquire);
        if (slot.version.load(std::memory_order_relaxed) != before) continue;
        r.entered_ns = since_ns;
        if (r.state == rec::State::entered && life_ended(r.epoch)) r.state = rec::State::failed;
        if (r.state != rec::State::empty) out.push_back(std::move(r));
        break;
      }
    }
  }
  // The groups it belongs to, as records of their own (Kind::member), after its calls.
  for (const auto& e : segment.groups) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      const auto before = e.version.load(std::memory_order_acquire);
      if (before & 1) continue;
      Recorded r;
      r.kind = rec::Kind::member;
      r.state = rec::State::completed;
      r.epoch = e.epoch;
      r.group = e.group;
      r.seq = e.seq;
      r.history = e.history;
      r.has_call = e.has_call != 0;
      r.op = rec::op_name(static_cast<rec::Op>(e.op));
      std::atomic_thread_fence(std::memory_order_acquire);
      if (e.version.load(std::memory_order_relaxed) != before) continue;
      r.entered_ns = since_ns;
      if (r.epoch != 0) out.push_back(std::move(r));
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

std::optional<StallReport> stall_report(const std::vector<RankView>& ranks, std::int64_t now_ns,
                                        std::chrono::milliseconds stall, CallKeys& reported) {
  const auto stall_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(stall).count();
  // The collective waited in longest, by any running rank.
  const Recorded* oldest = nullptr;
  for (const auto& r : ranks) {
    if (!r.running) continue;
    for (const auto& s : r.slots)
      if (collective(s) && s.state == rec::State::entered && now_ns - s.entered_ns >= stall_ns &&
          (oldest == nullptr || s.entered_ns < oldest->entered_ns ||
           // Seen at the same read: a rank still in #N holds up its peers waiting in #N+1.
           (s.entered_ns == oldest->entered_ns && s.epoch == oldest->epoch && s.group == oldest->group &&
            s.seq < oldest->seq)))
        oldest = &s;
  }
  if (oldest == nullptr) return p2p_stall(ranks, now_ns, stall_ns, reported);
  const Recorded ref = *oldest;
  if (!reported.insert({ref.epoch, ref.group, ref.seq}).second) return std::nullopt;

  StallReport report;
  std::vector<int> waiting;
  std::vector<std::pair<int, std::string>> waiting_states;
  std::vector<std::pair<int, pid_t>> waiting_pids;
  std::int64_t longest = 0;
  std::vector<std::string> others;
  // Ranks that completed the call (or left it): whoever still waits in it is what holds the
  // call up, not them (a rank frozen in a call whose data its peers already had).
  bool completed_by_some = false;
  // Of those, the ones waiting in the group's next call, by that call: "all_reduce #8".
  std::vector<std::pair<std::string, std::vector<std::pair<int, std::string>>>> waiting_next;
  auto suspect = [&](const RankView& r) {
    if (report.suspect < 0) report.suspect = r.rank;
    if (r.running && report.to_inspect.size() < 2) report.to_inspect.push_back({r.rank, r.pid});
  };
  for (const auto& r : ranks) {
    const Recorded* at = nullptr;     // its call with this number in the group
    const Recorded* last = nullptr;   // its latest call in the group
    const Recorded* done = nullptr;   // its latest completed call in the group
    bool member = false;  // of ref's group, by the groups it recorded (a rank that never called into it)
    const Recorded* entry = nullptr;  // a shared-ring group's latest call, kept beside the ring
    for (const auto& s : r.slots) {
      if (s.group != ref.group || s.epoch != ref.epoch) continue;
      if (s.kind == rec::Kind::member) {
        member = true;
        if (s.has_call) entry = &s;
      }
      if (!collective(s)) continue;
      if (s.seq == ref.seq) at = &s;
      if (last == nullptr || s.seq > last->seq) last = &s;
      if (s.state == rec::State::completed && (done == nullptr || s.seq > done->seq)) done = &s;
    }
    // Its latest call in a shared ring, pushed out by other calls: it has ended (a call still
    // open stays in the ring), so it is the last one completed.
    if (entry != nullptr && entry->seq != ref.seq && (last == nullptr || entry->seq > last->seq)) last = done = entry;
    // Sub-groups: a rank that never called into the group is taken for a non-member.
    if (ref.group >= 0 && last == nullptr && !member) continue;
    const std::string process = r.running ? "state: " + state_of(r) : r.ended;
    if (at == nullptr && entry != nullptr && entry->seq == ref.seq) {
      // Entered, and pushed out of the ring since: so it has left it (an open call stays).
      others.push_back(fmt::format("rank {} has left it ({} #{}; its record since pushed out by later calls; {})",
                                   r.rank, entry->op, ref.seq, process));
      completed_by_some = true;
      continue;
    }
    if (at != nullptr && same_call(*at, ref) && at->state == rec::State::entered && r.running) {
      waiting.push_back(r.rank);
      waiting_states.push_back({r.rank, process});
      waiting_pids.push_back({r.rank, r.pid});
      longest = std::max(longest, now_ns - at->entered_ns);
      continue;
    }
    suspect(r);
    if (at != nullptr && !same_call(*at, ref)) {
      others.push_back(fmt::format("rank {} called {} as #{} instead: the ranks' calls do not match", r.rank, what(*at),
                                   ref.seq));
      continue;
    }
    if (at != nullptr && at->state == rec::State::completed) {
      completed_by_some = true;
      if (r.running && last != nullptr && last->seq > ref.seq && collective(*last) && last->state == rec::State::entered) {
        const auto next = fmt::format("{} #{}", last->op, last->seq);
        auto same = std::find_if(waiting_next.begin(), waiting_next.end(), [&](const auto& w) { return w.first == next; });
        if (same == waiting_next.end()) same = waiting_next.insert(waiting_next.end(), {next, {}});
        same->second.push_back({r.rank, process});
        continue;
      }
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
      // Held in a send or recv of its own: that is where it is.
      const Recorded* newest = newest_of(r);
      if (newest != nullptr && blocked_in_p2p(*newest))
        others.push_back(fmt::format("rank {} never entered it: it waits in {} ({}; {})", r.rank, call_text(*newest),
                                     before, process));
      else
        others.push_back(fmt::format("rank {} never entered it ({}; {})", r.rank, before, process));
    }
  }
  // Waiting in a call that others completed: the waiting ranks are the ones to look at (a
  // stopped one, one stuck in D state), whatever else the others say.
  const bool frozen = completed_by_some && !waiting.empty();
  if (frozen) {
    for (auto it = waiting_next.rbegin(); it != waiting_next.rend(); ++it) {
      std::vector<int> who;
      for (const auto& [rank, process] : it->second) who.push_back(rank);
      others.insert(others.begin(), fmt::format("{} wait{} for it in {} ({} completed #{}; {})", list(who),
                                                who.size() == 1 ? "s" : "", it->first, who.size() == 1 ? "it" : "they",
                                                ref.seq, states_of(it->second)));
    }
    report.suspect = waiting.front();
    auto inspect = std::move(report.to_inspect);
    report.to_inspect.clear();
    for (const auto& w : waiting_pids)
      if (report.to_inspect.size() < 2) report.to_inspect.push_back(w);
    for (const auto& i : inspect)
      if (report.to_inspect.size() < 2) report.to_inspect.push_back(i);
  } else {
    for (const auto& [next, who] : waiting_next)
      for (const auto& [rank, process] : who) others.push_back(fmt::format("rank {} completed it ({})", rank, process));
  }
  auto& lines = report.lines;
  const auto d = details(ref);
  std::string head = fmt::format("stall: {} #{} on group {}{}: {} waiting {}", ref.op, ref.seq, group_name(ref.group),
                                 d.empty() ? "" : " (" + d + ")", list(waiting), seconds(longest));
  if (frozen) head += " (" + states_of(waiting_states) + ")";
  if (others.empty()) {
    head += "; every rank here entered it, so the backend or the network holds it (a cut link, a rank on another "
            "node that never came)";
    lines.push_back(std::move(head));
    // Every rank here waits: the first of them stands for the call.
    for (const auto& r : ranks)
      if (r.running && std::find(waiting.begin(), waiting.end(), r.rank) != waiting.end()) {
        suspect(r);
        break;
      }
  } else {
    lines.push_back(head + "; " + others.front());
    // A line per rank that is not waiting, up to a screenful: the report goes to every node.
    constexpr std::size_t kMostLines = 16;
    for (std::size_t i = 1; i < others.size() && i <= kMostLines; ++i) lines.push_back("stall: ... " + others[i]);
    if (others.size() > kMostLines + 1)
      lines.push_back(fmt::format("stall: ... and {} more ranks not waiting in it", others.size() - kMostLines - 1));
  }
  return report;
}

std::string views_text(const std::vector<RankView>& ranks, std::int64_t now_ns, const std::string& host,
                       std::size_t per_rank);

std::optional<std::vector<std::string>> job_wide_report(std::vector<RankView> views, std::int64_t now_ns,
                                                        std::chrono::milliseconds stall, CallKeys& reported,
                                                        const std::vector<std::string>& silent,
                                                        std::chrono::milliseconds waited) {
  std::sort(views.begin(), views.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  auto report = stall_report(views, now_ns, stall, reported);
  if (!report) return std::nullopt;
  std::vector<std::string> lines;
  const std::string everyone = silent.empty() ? "every rank of the job" : "every rank of the nodes that answered";
  for (auto& line : report->lines) {
    line = "stall (job-wide): " + line.substr(line.find(": ") + 2);
    if (const auto at = line.find("every rank here"); at != std::string::npos)
      line.replace(at, std::string_view("every rank here").size(), everyone);
    lines.push_back(std::move(line));
  }
  for (const auto& name : silent)
    lines.push_back(fmt::format("stall (job-wide): {} did not answer within {}: its ranks are not in this report", name,
                                common::duration_text(waited)));
  return lines;
}

std::string views_to_json(const std::vector<RankView>& ranks, std::int64_t now_ns, const std::string& host,
                          std::size_t budget) {
  // A slot as an array: [state, kind, op, dtype, epoch, group, root, seq, count, age in ms,
  // position, id, reduce]. The newest 8 calls of each rank, fewer while the text is over budget.
  std::string text = "[]";
  for (std::size_t per_rank = 8;; per_rank /= 2) {
    text = views_text(ranks, now_ns, host, per_rank);
    if (text.size() <= budget || per_rank <= 1) return text;
  }
}

std::string views_text(const std::vector<RankView>& ranks, std::int64_t now_ns, const std::string& host,
                       std::size_t per_rank) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : ranks) {
    std::vector<const Recorded*> newest;
    for (const auto& s : r.slots)
      if (s.kind != rec::Kind::member) newest.push_back(&s);
    std::sort(newest.begin(), newest.end(), [](auto* a, auto* b) { return a->position > b->position; });
    if (newest.size() > per_rank) newest.resize(per_rank);
    // Its groups, beyond the cap: a rank that never called into a group is still its member.
    for (const auto& s : r.slots)
      if (s.kind == rec::Kind::member) newest.push_back(&s);
    nlohmann::json slots = nlohmann::json::array();
    for (const auto* s : newest)
      slots.push_back({static_cast<int>(s->state), static_cast<int>(s->kind), s->op, s->dtype, s->epoch, s->group,
                       s->root, s->seq, s->count, (now_ns - s->entered_ns) / 1000000, s->position, s->id, s->reduce});
    out.push_back({{"rank", r.rank},
                   {"pid", r.pid},
                   {"running", r.running},
                   {"ended", r.ended},
                   {"host", host},
                   {"process", r.running ? process_state(r.pid) : r.ended},
                   {"slots", std::move(slots)}});
  }
  return out.dump();
}

bool views_from_json(const std::string& text, std::int64_t now_ns, std::vector<RankView>& out) {
  const auto in = nlohmann::json::parse(text, nullptr, false);
  if (!in.is_array()) return false;
  try {
    for (const auto& r : in) {
      RankView v;
      v.rank = r.at("rank").get<int>();
      v.pid = r.at("pid").get<pid_t>();
      v.running = r.at("running").get<bool>();
      v.ended = r.at("ended").get<std::string>();
      v.host = r.at("host").get<std::string>();
      v.process = r.at("process").get<std::string>();
      for (const auto& s : r.at("slots")) {
        Recorded c;
        c.state = static_cast<rec::State>(s.at(0).get<int>());
        c.kind = static_cast<rec::Kind>(s.at(1).get<int>());
        c.op = s.at(2).get<std::string>();
        c.dtype = s.at(3).get<std::uint8_t>();
        c.epoch = s.at(4).get<std::uint32_t>();
        c.group = s.at(5).get<std::int32_t>();
        c.root = s.at(6).get<std::int32_t>();
        c.seq = s.at(7).get<std::uint64_t>();
        c.count = s.at(8).get<std::uint64_t>();
        c.entered_ns = now_ns - s.at(9).get<std::int64_t>() * 1000000;
        c.position = s.at(10).get<std::uint64_t>();
        c.id = s.at(11).get<std::uint64_t>();
        c.reduce = s.at(12).get<std::uint8_t>();
        v.slots.push_back(std::move(c));
      }
      out.push_back(std::move(v));
    }
  } catch (const nlohmann::json::exception&) {
    return false;
  }
  return true;
}

bool stack_tool_available() {
  static const bool found = [] {
    const char* path = std::getenv("PATH");
    std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
    std::string dir;
    while (std::getline(dirs, dir, ':'))
      if (!dir.empty() && ::access((dir + "/gdb").c_str(), X_OK) == 0) return true;
    return false;
  }();
  return found;
}

std::vector<std::string> stack_of(pid_t pid) {
  // Each thread's innermost frames: where it waits, and deep enough to reach the program's own
  // call (a rank waiting in an shm all_reduce has main at frame 19).
  const auto command = fmt::format(
      "timeout -s KILL 10 gdb -p {} -batch -nx -q -ex 'set pagination off' -ex 'thread apply all -ascending bt 24' "
      "</dev/null 2>/dev/null",
      pid);
  std::vector<std::string> lines;
  FILE* out = ::popen(command.c_str(), "r");
  if (out == nullptr) return lines;
  char buffer[1024];
  constexpr std::size_t kMostLines = 60;
  while (std::fgets(buffer, sizeof(buffer), out) != nullptr) {
    std::string line(buffer);
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (line.rfind("Thread ", 0) != 0 && line.rfind("#", 0) != 0) continue;  // gdb's own chatter
    // Template-heavy frames run to hundreds of characters; where they are is at the front.
    constexpr std::size_t kWidest = 200;
    if (line.size() > kWidest) line = line.substr(0, kWidest - 3) + "...";
    if (lines.size() < kMostLines) lines.push_back(std::move(line));
  }
  ::pclose(out);  // our SIGCHLD handler may have reaped it already: its status is not needed
  return lines;
}

std::vector<std::string> status_table(const std::vector<RankView>& ranks, std::int64_t now_ns) {
  std::vector<std::pair<const RankView*, std::string>> rows;
  std::size_t width = 5;
  for (const auto& r : ranks) {
    rows.push_back({&r, where_is(r, now_ns)});
    width = std::max(width, rows.back().second.size());
  }
  std::vector<std::string> lines;
  lines.push_back(fmt::format("{:>5} {:>8}  {:<{}}  {}", "rank", "pid", "where", width, "process"));
  for (const auto& [r, where] : rows)
    lines.push_back(fmt::format("{:>5} {:>8}  {:<{}}  {}", r->rank, r->pid, where, width,
                                r->running ? state_of(*r) : r->ended));
  return lines;
}

// A group whose mismatch has been said: its calls' histories differ from then on.
constexpr std::uint64_t kGroupSaid = ~std::uint64_t{0};

// What every mismatch line ends with.
constexpr std::string_view kWrongResults =
    "(a call that did not raise returned wrong results: shared memory raises where it would read such data, gloo "
    "over TCP and mpi do with IDIST_DEBUG=1)";

std::vector<std::string> mismatch_report(const std::vector<RankView>& ranks, CallKeys& reported,
                                         HeldMismatches* held, bool running) {
  // (epoch, group, number) -> the calls made at it, and by whom.
  std::map<std::tuple<std::uint32_t, std::int32_t, std::uint64_t>, std::vector<std::pair<const Recorded*, int>>> at;
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
  // Each group's ranks, by the records they have of it.
  std::map<std::pair<std::uint32_t, std::int32_t>, std::set<int>> members;
  for (const auto& r : ranks)
    for (const auto& s : r.slots)
      if (collective(s) || s.kind == rec::Kind::member) members[{s.epoch, s.group}].insert(r.rank);
  std::vector<std::string> lines;
  auto said = [&](const std::tuple<std::uint32_t, std::int32_t, std::uint64_t>& key, std::string line) {
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
    // The calls, each with its ranks, in the order first seen.
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
    if (kinds.size() < 2) {
      // The same call here, but not the same calls before it: a mismatch whose call has left
      // the recorder (the ranks went on for a whole ring since). Said once per group.
      if (reported.count({epoch, group, kGroupSaid}) != 0) continue;
      std::vector<std::pair<std::uint64_t, std::vector<int>>> histories;
      for (const auto& [call, rank] : calls) {
        auto same = std::find_if(histories.begin(), histories.end(), [&](const auto& h) { return h.first == call->history; });
        if (same == histories.end()) same = histories.insert(histories.end(), {call->history, {}});
        if (std::find(same->second.begin(), same->second.end(), rank) == same->second.end()) same->second.push_back(rank);
      }
      if (histories.size() < 2) continue;
      std::vector<std::string> sides;
      for (auto& [history, who] : histories) {
        std::sort(who.begin(), who.end());
        sides.push_back(list(who));
      }
      const auto seen = std::find_if(calls.begin(), calls.end(), [](const auto& c) { return collective(*c.first); });
      say(fmt::format("mismatch: collective #{} on group {}: {}the ranks' calls up to it did not match ({}), and the "
                      "call that differed has left the recorder {}",
                      seq, group_name(group),
                      seen == calls.end() ? "" : "every rank called " + what(*seen->first) + ", but ",
                      fmt::join(sides, " against "), kWrongResults));
      continue;
    }
    std::vector<std::string> parts;
    const bool ops_differ = std::any_of(kinds.begin(), kinds.end(),
                                        [&](const auto& k) { return k.first->reduce != kinds.front().first->reduce; });
    for (auto& [call, who] : kinds) {
      std::sort(who.begin(), who.end());
      parts.push_back(fmt::format("{} called {}", list(who), what(*call, ops_differ)));
    }
    say(fmt::format("mismatch: collective #{} on group {}: {}; the ranks' calls must match {}", seq, group_name(group),
                    fmt::join(parts, ", "), kWrongResults));
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
