// Straggler reports (launchers/src/stall/straggler.hpp) on counters written by hand: who is
// named, how soon, what cause is said, and that a healthy job's noise names nobody.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "stall/straggler.hpp"

using namespace idist::launchers::detail;

namespace {

// A job of `ranks` ranks whose steps each rank's `work` (ms) takes; one reading per step.
struct Job {
  std::vector<WorkSample> now;
  explicit Job(int ranks) {
    for (int r = 0; r < ranks; ++r) now.push_back({.rank = r, .host = "hosta"});
  }
  const std::vector<WorkSample>& step(const std::vector<double>& work_ms, bool marks = true) {
    for (std::size_t r = 0; r < now.size(); ++r) {
      auto& s = now[r];
      if (marks) ++s.steps;
      s.gaps += 2;
      s.gap_ns += static_cast<std::uint64_t>(work_ms[r] * 1e6);
      if (marks) s.step_work_ns = s.gap_ns;
      s.run_ns += static_cast<std::uint64_t>(work_ms[r] * 1e6);
    }
    return now;
  }
};

// The step at which the detector first names anyone (0: never within `steps`), and its line.
std::pair<int, std::string> first_named(StragglerDetector& d, Job& job, int steps, const std::vector<double>& work) {
  for (int i = 1; i <= steps; ++i)
    if (auto lines = d.observe(job.step(work)); !lines.empty()) return {i, lines.front()};
  return {0, ""};
}

}  // namespace

TEST_CASE("a rank 20% slower is named within 5 steps, with the figures") {
  StragglerDetector d;
  Job job(4);
  const auto [at, line] = first_named(d, job, 50, {10, 10, 10, 12});
  CHECK(at == 6);  // 4 steps after the first reading judged (the warm-up: 2 steps)
  CHECK(line == "straggler: rank 3 (hosta) takes 20% longer than the median between collectives over the last 4 "
                "steps (12.0 ms against 10.0 ms a step)");
}

TEST_CASE("a rank 10% slower is named within 10 steps, after 8") {
  StragglerDetector d;
  Job job(4);
  const auto [at, line] = first_named(d, job, 50, {10, 10, 11, 10});
  CHECK(at == 10);
  CHECK(line.find("rank 2") != std::string::npos);
}

TEST_CASE("a healthy rank's single long steps do not hide a rank 10% slower at every step") {
  // Steps of 100 ms, rank 2's 110; each other rank takes 6 ms more every fourth step, by turns
  // (a late wake-up). Their 8-step means (101.5 ms) would put rank 2 at 8%: under the threshold.
  StragglerDetector d;
  Job job(4);
  int at = 0;
  for (int i = 1; i <= 30 && at == 0; ++i) {
    std::vector<double> work{100, 100, 110, 100};
    for (const int r : {0, 1, 3})
      if ((i + r) % 4 == 0) work[static_cast<std::size_t>(r)] += 6;
    if (!d.observe(job.step(work)).empty()) at = i;
  }
  CHECK(at > 0);
  CHECK(at <= 10);
}

TEST_CASE("each straggler once per episode: again only after a window back under the threshold") {
  StragglerDetector d;
  Job job(3);
  CHECK(first_named(d, job, 30, {10, 13, 10}).first > 0);
  CHECK(first_named(d, job, 30, {10, 13, 10}).first == 0);  // the same episode
  CHECK(first_named(d, job, 40, {10, 10, 10}).first == 0);  // recovered: nothing said
  CHECK(first_named(d, job, 30, {10, 13, 10}).first > 0);   // a new episode
}

TEST_CASE("a healthy job's noise (3% a step) names nobody over 300 steps") {
  StragglerDetector d;
  Job job(4);
  std::mt19937 random(7);
  std::uniform_real_distribution<double> noise(-0.03, 0.03);
  int named = 0;
  for (int i = 0; i < 300; ++i) {
    std::vector<double> work;
    for (int r = 0; r < 4; ++r) work.push_back(10 * (1 + noise(random)));
    named += static_cast<int>(d.observe(job.step(work)).size());
  }
  CHECK(named == 0);
}

// The first line a 2-rank job without steps gets, its ranks' work (ms) as given each reading.
static std::string first_line_without_steps(const std::vector<double>& work) {
  StragglerDetector d;
  Job job(2);
  for (int i = 0; i < 40; ++i)
    if (auto lines = d.observe(job.step(work, false)); !lines.empty()) return lines.front();
  return "";
}

TEST_CASE("without steps the ranks' time between calls is compared") {
  const auto said = first_line_without_steps({1.0, 1.5});
  CHECK(said.find("straggler: rank 1 (hosta) takes 50% longer than the median between collectives over the last") == 0);
  CHECK(said.find(" calls (0.8 ms against 0.5 ms a call)") != std::string::npos);
}

TEST_CASE("a call's work of microseconds is said in microseconds") {
  const auto said = first_line_without_steps({0.004, 0.024});
  CHECK(said.find(" calls (12.0 us against 2.0 us a call)") != std::string::npos);
}

TEST_CASE("the cause where /proc tells it: a shared cpu, a cgroup's cpu.max") {
  StragglerDetector d;
  Job job(4);
  std::string said;
  for (int i = 0; i < 20 && said.empty(); ++i) {
    job.now[1].wait_ns += 4'000'000;  // waited 4 ms for a cpu each step, against 12 ms on one
    job.now[1].throttled_us += 3000;
    if (auto lines = d.observe(job.step({10, 12, 10, 10})); !lines.empty()) said = lines.front();
  }
  CHECK(said.find("rank 1") != std::string::npos);
  CHECK(said.find("; its cpu is shared: it waited for one 33% as long as it ran") != std::string::npos);
  CHECK(said.find("; its cgroup's cpu.max held it back for ") != std::string::npos);
}

TEST_CASE("a change of ranks (a re-form) starts the window again") {
  StragglerDetector d;
  Job job(3);
  for (int i = 0; i < 4; ++i) d.observe(job.step({10, 10, 12}));
  Job smaller(2);
  CHECK(first_named(d, smaller, 4, {10, 13}).first == 0);  // 4 steps of a new window: too few
}

TEST_CASE("a slowdown that starts mid-run is named within 5 steps (20%) and 10 steps (10%) of its start") {
  for (const auto& [slower, within] : {std::pair{12.0, 5}, std::pair{11.0, 10}}) {
    StragglerDetector d;
    Job job(4);
    CHECK(first_named(d, job, 40, {10, 10, 10, 10}).first == 0);
    const auto at = first_named(d, job, 40, {10, slower, 10, 10}).first;
    CHECK(at > 0);
    CHECK(at <= within);
  }
}
