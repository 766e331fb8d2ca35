// idist-run's reading of the ranks' flight recorders (launchers/src/stall_report.hpp), on
// recorders written by hand: what a mismatch line and a stall report say, and when.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "stall_report.hpp"

using namespace idist::launchers::detail;
namespace rec = idist::common::recorder;

namespace {

constexpr std::uint32_t kEpoch = 1 << 16 | 1;

Recorded call(std::uint64_t seq, std::uint64_t count, rec::State state = rec::State::completed,
              std::int32_t group = -1) {
  Recorded r;
  r.state = state;
  r.op = "all_reduce";
  r.epoch = kEpoch;
  r.group = group;
  r.seq = seq;
  r.count = count;
  r.history = seq;  // the same calls before it on every rank
  r.id = seq;
  return r;
}

// A shared-ring group's entry (Kind::member), holding its latest call.
Recorded group_entry(std::int32_t group, std::uint64_t seq, const std::string& op) {
  Recorded r;
  r.kind = rec::Kind::member;
  r.state = rec::State::completed;
  r.op = op;
  r.epoch = kEpoch;
  r.group = group;
  r.seq = seq;
  r.has_call = true;
  return r;
}

// A rank as another node's views bring it: its process state already read (no /proc here).
RankView rank(int number, std::vector<Recorded> slots) {
  RankView v;
  v.rank = number;
  v.pid = 1000 + number;
  v.slots = std::move(slots);
  v.host = "node";
  v.process = "sleeping";
  return v;
}

bool has(const std::vector<std::string>& lines, const std::string& text) {
  for (const auto& l : lines)
    if (l.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("a mismatch seen before every rank reached the call waits one read, then names every rank") {
  // Rank 2 has not reached call #3 yet at the first read.
  std::vector<RankView> views = {rank(0, {call(2, 2), call(3, 3, rec::State::entered)}),
                                 rank(1, {call(2, 2), call(3, 2, rec::State::entered)}), rank(2, {call(2, 2)})};
  CallKeys reported;
  HeldMismatches held;
  CHECK(mismatch_report(views, reported, &held, true).empty());
  views[2].slots.push_back(call(3, 2, rec::State::entered));
  const auto lines = mismatch_report(views, reported, &held, true);
  REQUIRE(lines.size() == 1);
  CHECK(has(lines, "collective #3 on group world: rank 0 called all_reduce"));
  CHECK(has(lines, "ranks 1, 2 called all_reduce"));
  CHECK(mismatch_report(views, reported, &held, true).empty());  // once
}

TEST_CASE("a mismatch whose last rank never comes is said at the next read, as it stands") {
  const std::vector<RankView> views = {rank(0, {call(3, 3, rec::State::entered)}),
                                       rank(1, {call(3, 2, rec::State::entered)}), rank(2, {call(2, 2)})};
  CallKeys reported;
  HeldMismatches held;
  CHECK(mismatch_report(views, reported, &held, true).empty());
  const auto lines = mismatch_report(views, reported, &held, true);
  REQUIRE(lines.size() == 1);
  CHECK(has(lines, "rank 0 called all_reduce"));
  CHECK(has(lines, "rank 1 called all_reduce"));
}

TEST_CASE("a held mismatch whose call then leaves the recorders is said as it was held") {
  std::vector<RankView> views = {rank(0, {call(3, 3, rec::State::entered)}),
                                 rank(1, {call(3, 2, rec::State::entered)}), rank(2, {call(2, 2)})};
  CallKeys reported;
  HeldMismatches held;
  CHECK(mismatch_report(views, reported, &held, true).empty());
  for (auto& v : views) v.slots = {call(200, 2)};  // a whole ring of calls later
  const auto lines = mismatch_report(views, reported, &held, true);
  REQUIRE(lines.size() == 1);
  CHECK(has(lines, "collective #3 on group world: rank 0 called all_reduce"));
  CHECK(held.empty());
}

TEST_CASE("at the job's end the held mismatches are said too") {
  const std::vector<RankView> views = {rank(0, {call(3, 3, rec::State::entered)}),
                                       rank(1, {call(3, 2, rec::State::entered)}), rank(2, {call(2, 2)})};
  CallKeys reported;
  HeldMismatches held;
  CHECK(mismatch_report(views, reported, &held, true).empty());
  CHECK(mismatch_report({}, reported, &held, false).size() == 1);
}

TEST_CASE("at the job's end (no held set) a mismatch is said at once, whoever reached it") {
  const std::vector<RankView> views = {rank(0, {call(3, 3)}), rank(1, {call(3, 2)}), rank(2, {call(2, 2)})};
  CallKeys reported;
  CHECK(mismatch_report(views, reported).size() == 1);
}

TEST_CASE("calls that match are never held or said") {
  const std::vector<RankView> views = {rank(0, {call(3, 2, rec::State::entered)}), rank(1, {call(2, 2)})};
  CallKeys reported;
  HeldMismatches held;
  CHECK(mismatch_report(views, reported, &held, true).empty());
  CHECK(held.empty());
}

TEST_CASE("a rank whose last call on a shared-ring group left the ring: it is the last one completed") {
  // Group 9's call #0 was pushed out of rank 1's shared ring by sends; its group entry keeps it.
  const Recorded entry = group_entry(9, 0, "all_reduce");
  const std::int64_t now = 100'000'000'000;
  auto waiting = call(1, 2, rec::State::entered, 9);
  waiting.entered_ns = now - 5'000'000'000;
  const Recorded member_of_9 = group_entry(9, 1, "all_reduce");
  const std::vector<RankView> views = {rank(0, {waiting, member_of_9}), rank(1, {entry}), rank(2, {waiting, member_of_9})};
  CallKeys reported;
  const auto report = stall_report(views, now, std::chrono::seconds(1), reported);
  REQUIRE(report);
  REQUIRE(!report->lines.empty());
  INFO(report->lines[0]);
  CHECK(has(report->lines, "ranks 0, 2 waiting 5.0 s; rank 1 never entered it (last completed: all_reduce #0;"));
  CHECK(report->suspect == 1);
}

TEST_CASE("a rank whose record of the very call waited in was pushed out of its shared ring: it has left it") {
  const Recorded entry = group_entry(9, 1, "broadcast");
  const std::int64_t now = 100'000'000'000;
  auto waiting = call(1, 2, rec::State::entered, 9);
  waiting.op = "broadcast";
  waiting.entered_ns = now - 5'000'000'000;
  const std::vector<RankView> views = {rank(0, {waiting, entry}), rank(1, {entry}), rank(2, {waiting, entry})};
  CallKeys reported;
  const auto report = stall_report(views, now, std::chrono::seconds(1), reported);
  REQUIRE(report);
  INFO(report->lines[0]);
  CHECK(has(report->lines, "rank 1 has left it (broadcast #1; its record since pushed out by later calls;"));
  CHECK(!has(report->lines, "never entered"));
}
