#include "stall_report.hpp"

#include "call_words.hpp"
#include "supervise/process_tree.hpp"

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
using namespace call_words;

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
  const auto fields = proc_stat_fields(pid);
  if (fields.empty() || fields[0].empty()) return "gone";
  const char state = fields[0][0];
  std::ifstream wchan_file("/proc/" + std::to_string(pid) + "/wchan");
  std::string wchan;
  std::getline(wchan_file, wchan);
  const std::string in = wchan.empty() || wchan == "0" ? "" : " in " + wchan;
  switch (state) {
    case 'R': return "running (on a core, or ready for one)";
    case 'S': return "sleeping" + in;
    case 'D': return "in uninterruptible sleep" + in;
    case 'T': return "stopped (SIGSTOP or SIGTSTP)";
    case 't': return "stopped by a debugger";
    case 'Z': return "exited, not yet reaped";
    default: return std::string("state ") + state;
  }
}

namespace {

// The collective waited in longest by any running rank, at least `stall_ns`; nullptr if none.
const Recorded* longest_waited(const std::vector<RankView>& ranks, std::int64_t now_ns, std::int64_t stall_ns) {
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
  return oldest;
}

// One rank's records of the stalled call's group.
struct InGroup {
  const Recorded* at = nullptr;     // its call with this number in the group
  const Recorded* last = nullptr;   // its latest call in the group
  const Recorded* done = nullptr;   // its latest completed call in the group
  bool member = false;  // of ref's group, by the groups it recorded (a rank that never called into it)
  const Recorded* entry = nullptr;  // a shared-ring group's latest call, kept beside the ring
};

InGroup in_group(const RankView& r, const Recorded& ref) {
  InGroup g;
  for (const auto& s : r.slots) {
    if (s.group != ref.group || s.epoch != ref.epoch) continue;
    if (s.kind == rec::Kind::member) {
      g.member = true;
      if (s.has_call) g.entry = &s;
    }
    if (!collective(s)) continue;
    if (s.seq == ref.seq) g.at = &s;
    if (g.last == nullptr || s.seq > g.last->seq) g.last = &s;
    if (s.state == rec::State::completed && (g.done == nullptr || s.seq > g.done->seq)) g.done = &s;
  }
  // Its latest call in a shared ring, pushed out by other calls: it has ended (a call still
  // open stays in the ring), so it is the last one completed.
  if (g.entry != nullptr && g.entry->seq != ref.seq && (g.last == nullptr || g.entry->seq > g.last->seq))
    g.last = g.done = g.entry;
  return g;
}

// What the ranks say of the stalled call, gathered rank by rank.
struct Survey {
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
};

void suspect(StallReport& report, const RankView& r) {
  if (report.suspect < 0) report.suspect = r.rank;
  if (r.running && report.to_inspect.size() < 2) report.to_inspect.push_back({r.rank, r.pid});
}

// A rank with no record of the stalled call: past it, or short of it (and where it waits).
std::string absent_line(const RankView& r, const Recorded& ref, const InGroup& g, const std::string& process) {
  const std::string before = g.done != nullptr ? fmt::format("last completed: {} #{}", g.done->op, g.done->seq)
                                               : std::string("no collective completed in this group yet");
  if (g.last != nullptr && g.last->seq > ref.seq)
    return fmt::format("rank {} is past it, at {} #{} ({}; {})", r.rank, g.last->op, g.last->seq, before, process);
  // Held in a send or recv of its own: that is where it is.
  const Recorded* newest = newest_of(r);
  if (newest != nullptr && blocked_in_p2p(*newest))
    return fmt::format("rank {} never entered it: it waits in {} ({}; {})", r.rank, call_text(*newest), before,
                       process);
  return fmt::format("rank {} never entered it ({}; {})", r.rank, before, process);
}

// Where one rank stands toward the stalled call `ref`, added to `survey`.
void survey_rank(const RankView& r, const Recorded& ref, std::int64_t now_ns, StallReport& report, Survey& survey) {
  const InGroup g = in_group(r, ref);
  // Sub-groups: a rank that never called into the group is taken for a non-member.
  if (ref.group >= 0 && g.last == nullptr && !g.member) return;
  const std::string process = r.running ? "state: " + state_of(r) : r.ended;
  if (g.at == nullptr && g.entry != nullptr && g.entry->seq == ref.seq) {
    // Entered, and pushed out of the ring since: so it has left it (an open call stays).
    survey.others.push_back(fmt::format(
        "rank {} has left it ({} #{}; its record since pushed out by later calls; {})", r.rank, g.entry->op, ref.seq,
        process));
    survey.completed_by_some = true;
    return;
  }
  if (g.at != nullptr && same_call(*g.at, ref) && g.at->state == rec::State::entered && r.running) {
    survey.waiting.push_back(r.rank);
    survey.waiting_states.push_back({r.rank, process});
    survey.waiting_pids.push_back({r.rank, r.pid});
    survey.longest = std::max(survey.longest, now_ns - g.at->entered_ns);
    return;
  }
  suspect(report, r);
  if (g.at == nullptr) {
    survey.others.push_back(absent_line(r, ref, g, process));
  } else if (!same_call(*g.at, ref)) {
    survey.others.push_back(fmt::format("rank {} called {} as #{} instead: the ranks' calls do not match", r.rank,
                                        what(*g.at), ref.seq));
  } else if (g.at->state != rec::State::completed) {
    survey.others.push_back(fmt::format("rank {} {} in it ({})", r.rank,
                                        g.at->state == rec::State::failed ? "failed" : "entered it but", process));
  } else {
    survey.completed_by_some = true;
    const Recorded* last = g.last;
    if (r.running && last != nullptr && last->seq > ref.seq && collective(*last) && last->state == rec::State::entered) {
      const auto next = fmt::format("{} #{}", last->op, last->seq);
      auto& w = survey.waiting_next;
      auto same = std::find_if(w.begin(), w.end(), [&](const auto& n) { return n.first == next; });
      if (same == w.end()) same = w.insert(w.end(), {next, {}});
      same->second.push_back({r.rank, process});
    } else {
      survey.others.push_back(fmt::format("rank {} completed it ({})", r.rank, process));
    }
  }
}

// Waiting in a call that others completed: the waiting ranks are the ones to look at (a
// stopped one, one stuck in D state), whatever else the others say.
void point_at_waiting(Survey& survey, const Recorded& ref, StallReport& report) {
  for (auto it = survey.waiting_next.rbegin(); it != survey.waiting_next.rend(); ++it) {
    std::vector<int> who;
    for (const auto& [rank, process] : it->second) who.push_back(rank);
    survey.others.insert(survey.others.begin(),
                         fmt::format("{} wait{} for it in {} ({} completed #{}; {})", list(who),
                                     who.size() == 1 ? "s" : "", it->first, who.size() == 1 ? "it" : "they", ref.seq,
                                     states_of(it->second)));
  }
  report.suspect = survey.waiting.front();
  auto inspect = std::move(report.to_inspect);
  report.to_inspect.clear();
  for (const auto& w : survey.waiting_pids)
    if (report.to_inspect.size() < 2) report.to_inspect.push_back(w);
  for (const auto& i : inspect)
    if (report.to_inspect.size() < 2) report.to_inspect.push_back(i);
}

// The report's words: the call, who waits, and a line per rank that is not waiting.
void write_lines(const std::vector<RankView>& ranks, const Recorded& ref, const Survey& survey, bool frozen,
                 StallReport& report) {
  auto& lines = report.lines;
  const auto d = details(ref);
  std::string head = fmt::format("stall: {} #{} on group {}{}: {} waiting {}", ref.op, ref.seq, group_name(ref.group),
                                 d.empty() ? "" : " (" + d + ")", list(survey.waiting), seconds(survey.longest));
  if (frozen) head += " (" + states_of(survey.waiting_states) + ")";
  const auto& others = survey.others;
  if (others.empty()) {
    head += "; every rank here entered it, so the backend or the network holds it (a cut link, a rank on another "
            "node that never came)";
    lines.push_back(std::move(head));
    // Every rank here waits: the first of them stands for the call.
    for (const auto& r : ranks)
      if (r.running && std::find(survey.waiting.begin(), survey.waiting.end(), r.rank) != survey.waiting.end()) {
        suspect(report, r);
        break;
      }
    return;
  }
  lines.push_back(head + "; " + others.front());
  // A line per rank that is not waiting, up to a screenful: the report goes to every node.
  constexpr std::size_t kMostLines = 16;
  for (std::size_t i = 1; i < others.size() && i <= kMostLines; ++i) lines.push_back("stall: ... " + others[i]);
  if (others.size() > kMostLines + 1)
    lines.push_back(fmt::format("stall: ... and {} more ranks not waiting in it", others.size() - kMostLines - 1));
}

}  // namespace

std::optional<StallReport> stall_report(const std::vector<RankView>& ranks, std::int64_t now_ns,
                                        std::chrono::milliseconds stall, CallKeys& reported) {
  const auto stall_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(stall).count();
  const Recorded* oldest = longest_waited(ranks, now_ns, stall_ns);
  if (oldest == nullptr) return p2p_stall(ranks, now_ns, stall_ns, reported);
  const Recorded ref = *oldest;
  if (!reported.insert({ref.epoch, ref.group, ref.seq}).second) return std::nullopt;

  StallReport report;
  Survey survey;
  for (const auto& r : ranks) survey_rank(r, ref, now_ns, report, survey);
  const bool frozen = survey.completed_by_some && !survey.waiting.empty();
  if (frozen) {
    point_at_waiting(survey, ref, report);
  } else {
    for (const auto& [next, who] : survey.waiting_next)
      for (const auto& [rank, process] : who)
        survey.others.push_back(fmt::format("rank {} completed it ({})", rank, process));
  }
  write_lines(ranks, ref, survey, frozen, report);
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

}  // namespace idist::launchers::detail
