#include "trace_file.hpp"

#include <spdlog/fmt/fmt.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
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
constexpr int kP2pTrack = 1'000'000;  // a rank's point-to-point calls: tid kP2pTrack + rank

std::int64_t clock_ns(clockid_t clock) {
  timespec t{};
  ::clock_gettime(clock, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

// One slice: its JSON without the closing "}}" of its args and itself, so that the waits found
// once every node is in can be added.
struct Slice {
  int pid = 0, tid = 0;
  double ts = 0, dur = 0;
  std::string call;  // a collective's identity, the same on every rank ("" for point-to-point)
  std::string text;
  std::string extra;  // ,"waited_us":... added by add_waits
};

struct Part {
  std::vector<std::string> meta;
  std::vector<Slice> slices;
  std::uint64_t lost = 0;
  int ranks = 0;
};

std::string quoted(const std::string& s) { return nlohmann::json(s).dump(); }

std::string group_name(std::int32_t group) { return group < 0 ? "world" : "group " + std::to_string(group); }

void add_meta(Part& part, int pid, const std::string& process) {
  part.meta.push_back(fmt::format(R"({{"ph":"M","pid":{},"name":"process_name","args":{{"name":{}}}}})", pid,
                                  quoted(process)));
  part.meta.push_back(fmt::format(R"({{"ph":"M","pid":{},"name":"process_sort_index","args":{{"sort_index":{}}}}})",
                                  pid, pid));
}

void add_track(Part& part, int pid, int tid, const std::string& name, int order) {
  part.meta.push_back(fmt::format(R"({{"ph":"M","pid":{},"tid":{},"name":"thread_name","args":{{"name":{}}}}})", pid,
                                  tid, quoted(name)));
  part.meta.push_back(fmt::format(
      R"({{"ph":"M","pid":{},"tid":{},"name":"thread_sort_index","args":{{"sort_index":{}}}}})", pid, tid, order));
}

Slice slice_of(const TraceNode& node, const TracedRank& r, const TracedCall& c, std::int64_t to_unix) {
  const bool p2p = c.kind == static_cast<std::uint8_t>(rec::Kind::p2p);
  const bool open = c.end_ns == 0;
  const auto end = open ? std::max(node.end_ns, c.start_ns) : std::max(c.end_ns, c.start_ns);
  Slice s;
  s.pid = node.node_rank;
  s.tid = p2p ? kP2pTrack + r.rank : r.rank;
  s.ts = static_cast<double>(c.start_ns + to_unix - kTraceOrigin) / 1000;
  s.dur = static_cast<double>(end - c.start_ns) / 1000;
  const auto op = std::string(rec::op_name(static_cast<rec::Op>(c.op)));
  const char* state = open ? "open at the job's end"
                      : c.state == static_cast<std::uint8_t>(rec::State::failed) ? "failed" : "completed";
  const char* color = open ? R"("cname":"bad",)"
                      : c.state == static_cast<std::uint8_t>(rec::State::failed) ? R"("cname":"terrible",)" : "";
  if (p2p) {
    s.text = fmt::format(
        R"({{"ph":"X","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},"name":"{}","cat":"p2p",{}"args":{{"bytes":{},"peer":{},"tag":{},"group":"{}","attempt":{},"state":"{}")",
        s.pid, s.tid, s.ts, s.dur, op, color, c.bytes, c.root, c.seq, group_name(c.group), r.attempt, state);
    return s;
  }
  s.call = fmt::format("{}/{}/{}/{}", r.attempt, c.epoch, c.group, c.seq);
  s.text = fmt::format(
      R"({{"ph":"X","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},"name":"{}","cat":"collective",{}"args":{{"bytes":{},"group":"{}","seq":{},"call":"{}",{}"attempt":{},"state":"{}")",
      s.pid, s.tid, s.ts, s.dur, op, color, c.bytes, group_name(c.group), c.seq, s.call,
      c.root >= 0 ? fmt::format(R"("root":{},)", c.root) : "", r.attempt, state);
  return s;
}

Part render(const TraceNode& node) {
  const auto to_unix = clock_ns(CLOCK_REALTIME) - clock_ns(CLOCK_MONOTONIC);
  Part part;
  add_meta(part, node.node_rank, fmt::format("node {} ({})", node.node_rank, node.host));
  std::map<int, bool> tracks;  // rank -> has point-to-point calls
  for (const auto& r : node.ranks) {
    part.lost += r.lost;
    auto& p2p = tracks[r.rank];
    for (const auto& c : r.calls) {
      part.slices.push_back(slice_of(node, r, c, to_unix));
      p2p = p2p || c.kind == static_cast<std::uint8_t>(rec::Kind::p2p);
    }
  }
  for (const auto& [rank, p2p] : tracks) {
    add_track(part, node.node_rank, rank, fmt::format("rank {}", rank), 2 * rank);
    if (p2p) add_track(part, node.node_rank, kP2pTrack + rank, fmt::format("rank {} send/recv", rank), 2 * rank + 1);
  }
  part.ranks = static_cast<int>(tracks.size());
  return part;
}

// The collectives' waits, over every node: in each call, the rank that entered last is the one
// the others waited for.
std::vector<std::string> add_waits(std::vector<Slice>& slices) {
  std::map<std::string, std::vector<Slice*>> calls;
  for (auto& s : slices)
    if (!s.call.empty()) calls[s.call].push_back(&s);
  std::vector<std::string> arrows;
  for (auto& [call, members] : calls) {
    if (members.size() < 2) continue;
    const Slice* last = *std::max_element(members.begin(), members.end(),
                                          [](const Slice* a, const Slice* b) { return a->ts < b->ts; });
    for (Slice* s : members) {
      if (s == last) {
        s->extra = R"(,"last_in":true)";
        continue;
      }
      const double waited = last->ts - s->ts;
      s->extra = fmt::format(R"(,"waited_us":{:.3f},"waited_for":"rank {}")", waited, last->tid);
      if (waited < kArrowUs || waited < s->dur / 2 || arrows.size() >= 2 * kMostArrows) continue;
      const auto id = arrows.size() / 2;
      arrows.push_back(fmt::format(R"({{"ph":"s","id":{},"name":"waited for","cat":"wait","pid":{},"tid":{},"ts":{:.3f}}})",
                                   id, last->pid, last->tid, last->ts));
      arrows.push_back(fmt::format(
          R"({{"ph":"f","bp":"e","id":{},"name":"waited for","cat":"wait","pid":{},"tid":{},"ts":{:.3f}}})", id, s->pid,
          s->tid, last->ts));
    }
  }
  return arrows;
}

// A part another node wrote (write_part's layout: one event a line), or nullopt where it is
// not there yet, not this job's, or not whole.
std::optional<Part> read_part(const std::string& path, const std::string& run_id) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line) || line != R"({"traceEvents":[)") return std::nullopt;
  Part part;
  try {
    while (std::getline(in, line) && line != "],") {
      if (!line.empty() && line.back() == ',') line.pop_back();
      const auto e = nlohmann::json::parse(line);
      if (e.at("ph") != "X") {
        part.meta.push_back(line);
        continue;
      }
      Slice s;
      s.pid = e.at("pid");
      s.tid = e.at("tid");
      s.ts = e.at("ts");
      s.dur = e.at("dur");
      if (const auto& args = e.at("args"); args.contains("call")) s.call = args.at("call");
      s.text = line.substr(0, line.size() - 2);  // without "}}"
      part.slices.push_back(std::move(s));
    }
    std::getline(in, line);  // "displayTimeUnit"
    if (!std::getline(in, line) || !line.starts_with(R"("otherData":)")) return std::nullopt;
    const auto other = nlohmann::json::parse(line.substr(12, line.size() - 13));
    if (other.at("run_id") != run_id) return std::nullopt;
    part.lost = other.at("lost_calls");
    part.ranks = other.at("ranks");
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return part;
}

void write_file(const std::string& path, Part& part, const std::vector<std::string>& arrows, const nlohmann::json& other) {
  std::stable_sort(part.slices.begin(), part.slices.end(), [](const Slice& a, const Slice& b) {
    return std::tie(a.pid, a.tid, a.ts) < std::tie(b.pid, b.tid, b.ts);
  });
  const auto temp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temp, std::ios::trunc);
    out << "{\"traceEvents\":[\n";
    bool first = true;
    auto line = [&](const std::string& a, const std::string& b = "") {
      out << (first ? "" : ",\n") << a << b;
      first = false;
    };
    for (const auto& m : part.meta) line(m);
    for (const auto& s : part.slices) line(s.text, s.extra + "}}");
    for (const auto& a : arrows) line(a);
    out << "\n],\n\"displayTimeUnit\":\"ns\",\n\"otherData\":" << other.dump() << "}\n";
    out.flush();
    if (!out) {
      std::error_code ignored;
      fs::remove(temp, ignored);
      throw std::runtime_error("--trace: cannot write " + path);
    }
  }
  std::error_code ec;
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
  Part part = render(node);
  nlohmann::json other{{"run_id", node.run_id}, {"node", node.node_rank}, {"host", node.host},
                       {"lost_calls", part.lost}, {"ranks", part.ranks}, {"time_origin_unix_ns", kTraceOrigin}};
  if (node.node_rank > 0) {  // a part: node 0 adds the waits once every node is in
    const auto to = trace_part_path(path, node.node_rank);
    write_file(to, part, {}, other);
    return fmt::format("trace: this node's {} ranks ({} calls) in {}, for node 0 to merge", part.ranks,
                       part.slices.size(), to);
  }
  std::vector<int> nodes = {0}, missing;
  const auto deadline = std::chrono::steady_clock::now() + wait_for_parts;
  for (int k = 1; k < node.nnodes; ++k) {
    std::optional<Part> theirs;
    while (!(theirs = read_part(trace_part_path(path, k), node.run_id)) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!theirs) {
      missing.push_back(k);
      continue;
    }
    nodes.push_back(k);
    part.lost += theirs->lost;
    part.ranks += theirs->ranks;
    part.meta.insert(part.meta.end(), theirs->meta.begin(), theirs->meta.end());
    for (auto& s : theirs->slices) part.slices.push_back(std::move(s));
  }
  const auto arrows = add_waits(part.slices);
  other["nodes"] = nodes;
  other["lost_calls"] = part.lost;
  other["ranks"] = part.ranks;
  write_file(path, part, arrows, other);
  for (std::size_t i = 1; i < nodes.size(); ++i) {
    std::error_code ignored;
    fs::remove(trace_part_path(path, nodes[i]), ignored);
  }
  std::string line = fmt::format("trace: {} ranks on {} node{}, {} calls, in {} (open it in ui.perfetto.dev)", part.ranks,
                                 nodes.size(), nodes.size() == 1 ? "" : "s", part.slices.size(), path);
  if (part.lost > 0)
    line += fmt::format("; {} calls not kept (the ranks called faster than idist-run read, or beyond the last "
                        "calls it keeps of each rank)",
                        part.lost);
  for (const int k : missing)
    line += fmt::format("; node {}'s part was not found here within {} (it stays at {} on its host)", k,
                        common::duration_text(wait_for_parts), trace_part_path(path, k));
  return line;
}

}  // namespace idist::launchers::detail
