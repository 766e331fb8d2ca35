#include "trace_file.hpp"

#include <spdlog/fmt/fmt.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <unordered_map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <thread>

#include "idist/common/duration.hpp"
#include "idist/common/flight_recorder.hpp"

namespace idist::launchers::detail {
namespace {

namespace rec = common::recorder;
namespace fs = std::filesystem;

// 2023-11-14 22:13:20 UTC: every node's times count from here, in microseconds, which a double
// holds to a few ns for decades (a Unix-epoch microsecond would lose a quarter of one).
constexpr std::int64_t kTraceOrigin = 1'700'000'000'000'000'000;
// A wait drawn as an arrow from the rank that came last: long enough to matter, and few enough
// that the timeline stays readable.
constexpr double kArrowUs = 100;
constexpr std::size_t kMostArrows = 20'000;
// Track ids: rank R's collectives on tid R, its point-to-point calls on kP2pTrack + R, and a
// call that overlaps another of its kind without nesting on lane k, k * kLane more.
constexpr int kP2pTrack = 1'000'000;
constexpr int kLane = 10'000'000;

std::int64_t clock_ns(clockid_t clock) {
  timespec t{};
  ::clock_gettime(clock, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

std::string quoted(const std::string& s) { return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

// One slice: its JSON without the closing "}}" of its args and itself, so that the waits, known
// once every node is in, can be added.
struct Slice {
  int pid = 0, tid = 0, rank = 0;
  double ts = 0, dur = 0;
  std::string call;  // a collective's identity, the same on every rank ("" for point-to-point)
  std::string text;
};

struct Part {
  std::vector<std::string> meta;
  std::vector<Slice> slices;
  std::vector<std::string> marks;  // the ranks' step marks (instant events)
  std::uint64_t lost = 0;
  int ranks = 0;
};

// Each collective's last rank in: the one every other waited for.
struct Latest {
  double ts = 0;
  int pid = 0, tid = 0, rank = 0;
};
using Latecomers = std::unordered_map<std::string, Latest>;

void note(Latecomers& latest, const Slice& s) {
  if (s.call.empty()) return;
  auto [it, fresh] = latest.try_emplace(s.call, Latest{s.ts, s.pid, s.tid, s.rank});
  if (!fresh && s.ts > it->second.ts) it->second = {s.ts, s.pid, s.tid, s.rank};
}

// The wait `s` had, as args to add (and an arrow where it is long and inside its call).
std::string waits(const Slice& s, const Latecomers& latest, std::vector<std::string>& arrows) {
  const auto it = s.call.empty() ? latest.end() : latest.find(s.call);
  if (it == latest.end()) return "";
  const Latest& last = it->second;
  if (last.pid == s.pid && last.tid == s.tid && last.ts == s.ts) return R"(,"last_in":true)";
  const double waited = last.ts - s.ts;
  if (waited >= kArrowUs && waited >= s.dur / 2 && waited <= s.dur && arrows.size() < 2 * kMostArrows) {
    const auto id = arrows.size() / 2;
    arrows.push_back(fmt::format(R"({{"ph":"s","id":{},"name":"waited for","cat":"wait","pid":{},"tid":{},"ts":{:.3f}}})",
                                 id, last.pid, last.tid, last.ts));
    arrows.push_back(fmt::format(R"({{"ph":"f","bp":"e","id":{},"name":"waited for","cat":"wait","pid":{},"tid":{},"ts":{:.3f}}})",
                                 id, s.pid, s.tid, last.ts));
  }
  return fmt::format(R"(,"waited_us":{:.3f},"waited_for":"rank {}")", waited, last.rank);
}

std::string group_name(std::int32_t group) { return group < 0 ? "world" : "group " + std::to_string(group); }

Slice slice_of(const TraceNode& node, const TracedRank& r, const TracedCall& c, std::int64_t to_unix) {
  const bool p2p = c.kind == static_cast<std::uint8_t>(rec::Kind::p2p);
  const bool open = c.end_ns == 0;
  const bool failed = c.state == static_cast<std::uint8_t>(rec::State::failed);
  const auto end = std::max(open ? node.end_ns : c.end_ns, c.start_ns);
  Slice s;
  s.pid = node.node_rank;
  s.rank = r.rank;
  s.ts = static_cast<double>(c.start_ns + to_unix - kTraceOrigin) / 1000;
  s.dur = static_cast<double>(end - c.start_ns) / 1000;
  const auto op = std::string(rec::op_name(static_cast<rec::Op>(c.op)));
  const char* state = open ? "open at the job's end" : failed ? "failed" : "completed";
  const char* color = open ? R"("cname":"bad",)" : failed ? R"("cname":"terrible",)" : "";
  // The text from "dur" on: its start, with the tid, goes in once the lane is known (place_in_lanes).
  if (p2p) {
    s.tid = kP2pTrack + r.rank;
    s.text = fmt::format(R"("dur":{:.3f},"name":"{}","cat":"p2p",{}"args":{{"rank":{},"bytes":{},"peer":{},"tag":{},"group":"{}","attempt":{},"state":"{}")",
                         s.dur, op, color, r.rank, c.bytes, c.root, c.seq, group_name(c.group), r.attempt, state);
    return s;
  }
  s.tid = r.rank;
  s.call = fmt::format("{}/{}/{}/{}", r.attempt, c.epoch, c.group, c.seq);
  s.text = fmt::format(R"("dur":{:.3f},"name":"{}","cat":"collective",{}"args":{{"rank":{},"bytes":{},"group":"{}","seq":{},"call":"{}",{}"attempt":{},"state":"{}")",
                       s.dur, op, color, r.rank, c.bytes, group_name(c.group), c.seq, s.call,
                       c.root >= 0 ? fmt::format(R"("root":{},)", c.root) : "", r.attempt, state);
  return s;
}

void add_track(Part& part, int pid, int tid, const std::string& name, int order) {
  part.meta.push_back(fmt::format(R"({{"ph":"M","pid":{},"tid":{},"name":"thread_name","args":{{"name":{}}}}})", pid,
                                  tid, quoted(name)));
  part.meta.push_back(fmt::format(
      R"({{"ph":"M","pid":{},"tid":{},"name":"thread_sort_index","args":{{"sort_index":{}}}}})", pid, tid, order));
}

// A track's slices in order of start, each on the first lane where it follows the last slice
// (a lane is a track of its own: Perfetto draws only slices that nest).
void place_in_lanes(Part& part, std::vector<Slice>& track) {
  std::ranges::stable_sort(track, {}, &Slice::ts);
  std::vector<double> lane_end;
  const int base = track.front().tid, rank = track.front().rank;
  const bool p2p = base >= kP2pTrack;
  for (auto& s : track) {
    std::size_t lane = 0;
    while (lane < lane_end.size() && lane_end[lane] > s.ts) ++lane;
    if (lane == lane_end.size()) {
      lane_end.push_back(0);
      add_track(part, s.pid, base + static_cast<int>(lane) * kLane,
                fmt::format("rank {}{}{}", rank, p2p ? " send/recv" : "", lane == 0 ? "" : fmt::format(" ({})", lane + 1)),
                rank * 64 + (p2p ? 32 : 0) + static_cast<int>(lane));
    }
    lane_end[lane] = s.ts + s.dur;
    s.tid = base + static_cast<int>(lane) * kLane;
    s.text = fmt::format(R"({{"ph":"X","pid":{},"tid":{},"ts":{:.3f},)", s.pid, s.tid, s.ts) + s.text;
    part.slices.push_back(std::move(s));
  }
}

Part render(const TraceNode& node) {
  const auto to_unix = clock_ns(CLOCK_REALTIME) - clock_ns(CLOCK_MONOTONIC);
  Part part;
  const int pid = node.node_rank;
  part.meta.push_back(fmt::format(R"({{"ph":"M","pid":{},"name":"process_name","args":{{"name":{}}}}})", pid,
                                  quoted(fmt::format("node {} ({})", pid, node.host))));
  part.meta.push_back(fmt::format(R"({{"ph":"M","pid":{},"name":"process_sort_index","args":{{"sort_index":{}}}}})", pid, pid));
  std::map<int, std::vector<Slice>> tracks;  // by lane 0's tid
  std::set<int> ranks;
  for (const auto& r : node.ranks) {
    part.lost += r.lost;
    ranks.insert(r.rank);
    for (const auto& c : r.calls) {
      auto s = slice_of(node, r, c, to_unix);
      tracks[s.tid].push_back(std::move(s));
    }
  }
  for (auto& [tid, track] : tracks) place_in_lanes(part, track);
  for (const auto& r : node.ranks) {  // step marks on the rank's track, after its slices
    if (!r.steps.empty() && !tracks.contains(r.rank)) {  // no collective: the track is the marks'
      add_track(part, pid, r.rank, fmt::format("rank {}", r.rank), r.rank * 64);
      tracks[r.rank];
    }
    for (const auto& [number, at] : r.steps)
      part.marks.push_back(fmt::format(
          R"({{"ph":"i","s":"t","name":"step {}","cat":"step","pid":{},"tid":{},"ts":{:.3f},"args":{{"attempt":{}}}}})",
          number, pid, r.rank, static_cast<double>(at + to_unix - kTraceOrigin) / 1000, r.attempt));
  }
  part.ranks = static_cast<int>(ranks.size());
  return part;
}

// The otherData of a part another node wrote (write_file's layout: one event a line, then these
// lines), where it is this job's, written since `since`; else nullopt.
std::optional<nlohmann::json> part_data(const std::string& path, const std::string& run_id, std::int64_t since) {
  std::ifstream in(path);
  std::string line, last;
  if (!in || !std::getline(in, line) || line != R"({"traceEvents":[)") return std::nullopt;
  while (std::getline(in, line))
    if (line.starts_with(R"("otherData":)")) last = line;
  try {
    auto other = nlohmann::json::parse(last.substr(12, last.size() - 13));
    if (other.at("run_id") != run_id || other.at("written_unix_ns").get<std::int64_t>() < since) return std::nullopt;
    return other;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// Each event line of a part, as `each(line, event)`.
template <class Each>
void for_each_event(const std::string& path, Each&& each) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line) && line != "],") {
    if (!line.empty() && line.back() == ',') line.pop_back();
    each(line, nlohmann::json::parse(line));
  }
}

Slice slice_from(const std::string& line, const nlohmann::json& e) {
  Slice s;
  s.pid = e.at("pid");
  s.tid = e.at("tid");
  s.ts = e.at("ts");
  s.dur = e.at("dur");
  const auto& args = e.at("args");
  s.rank = args.value("rank", 0);
  if (args.contains("call")) s.call = args.at("call");
  s.text = line.substr(0, line.size() - 2);  // without "}}"
  return s;
}

// Writes FILE atomically: this node's part, then (node 0) the other nodes' parts streamed from
// their files, each collective with its wait where `latest` knows its call.
void write_file(const std::string& path, const Part& part, const std::vector<std::string>& others,
                const Latecomers* latest, const nlohmann::json& other) {
  const auto temp = path + ".tmp." + std::to_string(::getpid());
  std::ofstream out(temp, std::ios::trunc);
  std::vector<std::string> arrows;
  bool first = true;
  auto line = [&](const std::string& a, const std::string& b = "") {
    out << (first ? "" : ",\n") << a << b;
    first = false;
  };
  out << "{\"traceEvents\":[\n";
  for (const auto& m : part.meta) line(m);
  for (const auto& o : others)
    for_each_event(o, [&](const std::string& text, const nlohmann::json& e) {
      if (e.at("ph") == "M") line(text);
    });
  for (const auto& s : part.slices) line(s.text, (latest ? waits(s, *latest, arrows) : "") + "}}");
  for (const auto& m : part.marks) line(m);
  for (const auto& o : others)
    for_each_event(o, [&](const std::string& text, const nlohmann::json& e) {
      if (e.at("ph") == "X")
        line(text.substr(0, text.size() - 2), waits(slice_from(text, e), *latest, arrows) + "}}");
      else if (e.at("ph") != "M")
        line(text);
    });
  for (const auto& a : arrows) line(a);
  out << "\n],\n\"displayTimeUnit\":\"ns\",\n\"otherData\":"
      << other.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "}\n";
  out.close();
  std::error_code ec;
  if (!out) {
    fs::remove(temp, ec);
    throw std::runtime_error("--trace: cannot write " + path + " (a full disk?)");
  }
  fs::rename(temp, path, ec);
  if (ec) throw std::runtime_error("--trace: cannot write " + path + ": " + ec.message());
}

}  // namespace

std::string trace_part_path(const std::string& path, int node_rank) {
  return path + ".node" + std::to_string(node_rank);
}

std::string check_trace_path(const std::string& path) {
  if (path.empty()) return "--trace: the file name is empty";
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) return "--trace " + path + ": is a directory; give a file name";
  const auto dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  if (!fs::is_directory(dir, ec)) return "--trace " + path + ": no directory " + dir.string();
  if (::access(dir.c_str(), W_OK) != 0) return "--trace " + path + ": cannot write in " + dir.string();
  return "";
}

std::string write_trace(const std::string& path, const TraceNode& node, std::chrono::milliseconds wait_for_parts) {
  const Part part = render(node);
  nlohmann::json other{{"run_id", node.run_id}, {"node", node.node_rank}, {"host", node.host},
                       {"lost_calls", part.lost}, {"ranks", part.ranks}, {"time_origin_unix_ns", kTraceOrigin},
                       {"written_unix_ns", clock_ns(CLOCK_REALTIME)}};
  if (node.node_rank > 0) {  // a part: node 0 adds the waits once every node is in
    const auto to = trace_part_path(path, node.node_rank);
    write_file(to, part, {}, nullptr, other);
    return fmt::format("trace: this node's {} ranks ({} calls) in {}, for node 0 to merge", part.ranks,
                       part.slices.size(), to);
  }
  Latecomers latest;
  for (const auto& s : part.slices) note(latest, s);
  std::vector<int> nodes = {0}, missing;
  std::vector<std::string> parts;
  auto lost = part.lost;
  auto ranks = part.ranks;
  std::size_t calls = part.slices.size();
  const auto deadline = std::chrono::steady_clock::now() + wait_for_parts;
  for (int k = 1; k < node.nnodes; ++k) {
    const auto at = trace_part_path(path, k);
    std::optional<nlohmann::json> theirs;
    while (!(theirs = part_data(at, node.run_id, node.started_unix_ns)) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    try {
      if (theirs)
        for_each_event(at, [&](const std::string& text, const nlohmann::json& e) {
          if (e.at("ph") != "X") return;
          note(latest, slice_from(text, e));
          ++calls;
        });
    } catch (const std::exception&) {
      theirs.reset();
    }
    if (!theirs) {
      missing.push_back(k);
      continue;
    }
    nodes.push_back(k);
    parts.push_back(at);
    lost += theirs->value("lost_calls", std::uint64_t{0});
    ranks += theirs->value("ranks", 0);
  }
  other["nodes"] = nodes;
  other["lost_calls"] = lost;
  other["ranks"] = ranks;
  write_file(path, part, parts, &latest, other);
  for (const auto& at : parts) {
    std::error_code ignored;
    fs::remove(at, ignored);
  }
  std::string line = fmt::format("trace: {} ranks on {} node{}, {} calls, in {} (open it in ui.perfetto.dev)", ranks,
                                 nodes.size(), nodes.size() == 1 ? "" : "s", calls, path);
  if (lost > 0)
    line += fmt::format("; {} calls not kept (the ranks called faster than idist-run read, or beyond the newest "
                        "calls it keeps)",
                        lost);
  for (const int k : missing)
    line += fmt::format("; node {}'s part was not found here within {} (it stays at {} on its host)", k,
                        common::duration_text(wait_for_parts), trace_part_path(path, k));
  return line;
}

}  // namespace idist::launchers::detail
