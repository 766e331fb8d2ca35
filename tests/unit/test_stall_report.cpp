// idist-run's reading of the ranks' flight recorders (launchers/src/stall/stall_report.hpp), on
// recorders written by hand: what a mismatch line and a stall report say, and when.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "idist/types.hpp"
#include "stall/stall_report.hpp"

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

TEST_CASE("a rank frozen in a call its peers completed: its state, its stack, and who waits for it next") {
  // Shared memory, rank 0 stopped inside all_reduce #7: ranks 1 and 2 got their results and
  // wait in #8, which cannot begin without rank 0. The reader saw all three as they are now at
  // the same read, so the calls are equally old.
  const std::int64_t now = 100'000'000'000;
  auto in_7 = call(7, 2, rec::State::entered);
  in_7.entered_ns = now - 5'100'000'000;
  auto in_8 = call(8, 2, rec::State::entered);
  in_8.entered_ns = in_7.entered_ns;
  std::vector<RankView> views = {rank(0, {call(6, 2), in_7}), rank(1, {call(6, 2), call(7, 2), in_8}),
                                 rank(2, {call(6, 2), call(7, 2), in_8})};
  views[0].process = "stopped (SIGSTOP or SIGTSTP)";
  views[1].process = "sleeping in futex_wait_queue";
  views[2].process = "sleeping in futex_wait_queue";
  CallKeys reported;
  const auto report = stall_report(views, now, std::chrono::seconds(1), reported);
  REQUIRE(report);
  REQUIRE(!report->lines.empty());
  INFO(report->lines[0]);
  CHECK(has(report->lines, "all_reduce #7 on group world (int8, 2 elements): rank 0 waiting 5.1 s (state: stopped "
                           "(SIGSTOP or SIGTSTP) on node)"));
  CHECK(has(report->lines, "ranks 1, 2 wait for it in all_reduce #8 (they completed #7; state: sleeping in "
                           "futex_wait_queue on node)"));
  CHECK(report->suspect == 0);
  REQUIRE(!report->to_inspect.empty());
  CHECK(report->to_inspect.front() == std::pair<int, pid_t>{0, 1000});
}

TEST_CASE("a rank frozen in its peers' last call: its state and its stack") {
  // Rank 2 stopped inside all_reduce #7, the last call of its peers, which went on in their own
  // code (rank 0) or exited (rank 1).
  const std::int64_t now = 100'000'000'000;
  auto in_7 = call(7, 2, rec::State::entered);
  in_7.entered_ns = now - 60'100'000'000;
  std::vector<RankView> views = {rank(0, {call(6, 2), call(7, 2)}), rank(1, {call(6, 2), call(7, 2)}),
                                 rank(2, {call(6, 2), in_7})};
  views[1].running = false;
  views[1].ended = "exited with code 0";
  views[2].process = "running";
  CallKeys reported;
  const auto report = stall_report(views, now, std::chrono::seconds(1), reported);
  REQUIRE(report);
  REQUIRE(!report->lines.empty());
  INFO(report->lines[0]);
  CHECK(has(report->lines, "rank 2 waiting 60.1 s (state: running on node); rank 0 completed it (state: sleeping on node)"));
  CHECK(has(report->lines, "rank 1 completed it (exited with code 0)"));
  CHECK(report->suspect == 2);
  REQUIRE(!report->to_inspect.empty());
  CHECK(report->to_inspect.front() == std::pair<int, pid_t>{2, 1002});
}

TEST_CASE("reduce ops by name, AVG included: SUM, the default, is named where the ranks' ops differ") {
  auto sum = call(3, 2, rec::State::entered);
  auto avg = sum;
  avg.reduce = static_cast<std::uint8_t>(idist::ReduceOp::AVG);
  CallKeys reported;
  const auto lines = mismatch_report({rank(0, {sum}), rank(1, {avg})}, reported, nullptr, true);
  REQUIRE(lines.size() == 1);
  CHECK(has(lines, "rank 0 called all_reduce (int8 SUM, 2 elements), rank 1 called all_reduce (int8 AVG, 2 elements)"));

  // A stall names a MAX; a SUM goes unnamed there, as the calls agree on it.
  const std::int64_t now = 100'000'000'000;
  auto in_5 = call(5, 2, rec::State::entered);
  in_5.reduce = static_cast<std::uint8_t>(idist::ReduceOp::MAX);
  in_5.entered_ns = now - 5'000'000'000;
  CallKeys stalls;
  const auto report = stall_report({rank(0, {in_5}), rank(1, {call(4, 2)})}, now, std::chrono::seconds(1), stalls);
  REQUIRE(report);
  CHECK(has(report->lines, "all_reduce #5 on group world (int8 MAX, 2 elements)"));
}
