// The trace's file (launchers/src/output/trace_file.hpp) from calls written by hand: lanes for
// calls that overlap, the waits and their arrows, node 0 merging node 1's part, and a part an
// earlier job left behind refused.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "idist/common/flight_recorder.hpp"
#include "output/trace_file.hpp"

using namespace idist::launchers::detail;
namespace rec = idist::common::recorder;

namespace {

constexpr std::int64_t kMs = 1'000'000;

TracedCall collective(std::uint64_t seq, std::int64_t start_ms, std::int64_t end_ms) {
  return {.start_ns = start_ms * kMs, .end_ns = end_ms * kMs, .seq = seq, .bytes = 8, .epoch = 1, .group = -1,
          .root = -1, .op = static_cast<std::uint8_t>(rec::Op::all_reduce),
          .kind = static_cast<std::uint8_t>(rec::Kind::collective), .state = static_cast<std::uint8_t>(rec::State::completed)};
}

TracedCall p2p(rec::Op op, std::int64_t start_ms, std::int64_t end_ms) {
  auto c = collective(0, start_ms, end_ms);
  c.op = static_cast<std::uint8_t>(op);
  c.kind = static_cast<std::uint8_t>(rec::Kind::p2p);
  return c;
}

TraceNode node(int node_rank, int nnodes, std::vector<TracedRank> ranks) {
  TraceNode n;
  n.run_id = "job-1";
  n.host = "host" + std::to_string(node_rank);
  n.node_rank = node_rank;
  n.nnodes = nnodes;
  n.end_ns = 100 * kMs;
  n.started_unix_ns = 0;
  n.ranks = std::move(ranks);
  return n;
}

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string(name) + std::to_string(::getpid()) + ".json")).string();
}

nlohmann::json load(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("one node: a slice per call, overlapping calls on a second lane, the latecomer named") {
  const auto path = temp_path("trace-one");
  // Rank 1 enters call 0 at 5 ms, rank 0 at 1 ms: rank 0 waited 4 ms for rank 1. Rank 0's isend
  // and irecv overlap without nesting: two lanes of its send/recv track.
  auto line = write_trace(path, node(0, 1, {{.rank = 0, .calls = {collective(0, 1, 6), p2p(rec::Op::isend, 10, 20),
                                                                    p2p(rec::Op::irecv, 12, 25)},
                                             .steps = {{1, 30 * kMs}}},
                                            {.rank = 1, .calls = {collective(0, 5, 6)}}}),
                          std::chrono::milliseconds(0));
  CHECK(line.find("trace: 2 ranks on 1 node, 4 calls, in " + path) == 0);
  const auto doc = load(path);
  std::set<int> tids;
  const nlohmann::json* waiter = nullptr;
  int arrows = 0, marks = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "i" && e["name"] == "step 1" && e["tid"] == 0) ++marks;
    if (e["ph"] == "X") tids.insert(e["tid"].get<int>());
    if (e["ph"] == "X" && e["name"] == "all_reduce" && e["tid"] == 0) waiter = &e;
    if (e["ph"] == "s" || e["ph"] == "f") ++arrows;
  }
  CHECK(tids == std::set<int>{0, 1, 1'000'000, 11'000'000});  // rank 0, rank 1, rank 0's send/recv and its lane 2
  REQUIRE(waiter != nullptr);
  CHECK((*waiter)["args"]["waited_for"] == "rank 1");
  CHECK((*waiter)["args"]["waited_us"].get<double>() == doctest::Approx(4000).epsilon(0.001));
  CHECK(arrows == 2);  // 4 ms of a 5 ms call: an arrow
  CHECK(marks == 1);   // rank 0's step mark, on its track
  CHECK(doc["otherData"]["lost_calls"] == 0);
  std::filesystem::remove(path);
}

TEST_CASE("two nodes: node 1's part merged by node 0, waits across nodes; a stale part refused") {
  const auto path = temp_path("trace-two");
  const auto part_line = write_trace(path, node(1, 2, {{.rank = 2, .calls = {collective(0, 9, 10)}}}),
                                     std::chrono::milliseconds(0));
  CHECK(part_line.find("trace: this node's 1 ranks (1 calls) in " + trace_part_path(path, 1)) == 0);
  auto zero = node(0, 2, {{.rank = 0, .calls = {collective(0, 1, 10)}}});
  auto line = write_trace(path, zero, std::chrono::milliseconds(0));
  CHECK(line.find("trace: 2 ranks on 2 nodes, 2 calls") == 0);
  CHECK_FALSE(std::filesystem::exists(trace_part_path(path, 1)));
  bool waited = false;
  std::set<int> pids;
  const auto doc = load(path);
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    pids.insert(e["pid"].get<int>());
    if (e["tid"] == 0) waited = e["args"]["waited_for"] == "rank 2";
  }
  CHECK(pids == std::set<int>{0, 1});
  CHECK(waited);

  // A part written before node 0 started is an earlier job's: not merged, and said.
  write_trace(path, node(1, 2, {{.rank = 2, .calls = {collective(0, 9, 10)}}}), std::chrono::milliseconds(0));
  zero.started_unix_ns = std::numeric_limits<std::int64_t>::max();
  line = write_trace(path, zero, std::chrono::milliseconds(0));
  CHECK(line.find("trace: 1 ranks on 1 node") == 0);
  CHECK(line.find("node 1's part was not found here") != std::string::npos);
  std::filesystem::remove(path);
  std::filesystem::remove(trace_part_path(path, 1));
}

TEST_CASE("a path that cannot be written is said before anything starts") {
  CHECK(check_trace_path("/nonexistent/dir/t.json") == "--trace /nonexistent/dir/t.json: no directory /nonexistent/dir");
  CHECK(check_trace_path("/tmp").find("is a directory") != std::string::npos);
  CHECK(check_trace_path("").find("empty") != std::string::npos);
  CHECK(check_trace_path(temp_path("ok")).empty());
}
