#include "straggler.hpp"

#include <spdlog/fmt/fmt.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>

#include "idist/common/duration.hpp"

namespace idist::launchers::detail {

namespace {

// At ten readings a second, a minute: the window is 20 steps or a minute, whichever is shorter.
constexpr std::size_t kMostReadings = 600;
constexpr std::uint64_t kLeastCalls = 20;    // gaps a rank must have had in a window without steps
constexpr std::uint64_t kWarmUpSteps = 2;
using Ms = std::chrono::duration<double, std::milli>;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The median of `sorted` without one element equal to `x` (a rank against the others), without
// sorting again: a reading of 256 ranks compares each with the rest.
double median_without(const std::vector<double>& sorted, double x) {
  const auto skip = static_cast<std::size_t>(std::lower_bound(sorted.begin(), sorted.end(), x) - sorted.begin());
  const auto at = [&](std::size_t k) { return sorted[k < skip ? k : k + 1]; };
  const auto n = sorted.size() - 1;
  return n % 2 ? at(n / 2) : (at(n / 2 - 1) + at(n / 2)) / 2;
}

bool same_ranks(const std::vector<WorkSample>& a, const std::vector<WorkSample>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](const auto& x, const auto& y) {
           return x.rank == y.rank && x.pid == y.pid;
         });
}

// after - before, or 0 where a counter went backwards (a file that could not be read).
std::uint64_t delta(std::uint64_t after, std::uint64_t before) { return after > before ? after - before : 0; }

// What /proc says slowed rank i in the window, where it stands out from the others: "; its cpu
// is shared: ...", or "".
std::string cause(const std::vector<WorkSample>& now, const std::vector<WorkSample>& base, std::size_t i) {
  const auto share = [&](std::size_t j) {
    const auto run = delta(now[j].run_ns, base[j].run_ns);
    return run == 0 ? 0.0 : static_cast<double>(delta(now[j].wait_ns, base[j].wait_ns)) / static_cast<double>(run);
  };
  std::vector<double> others;
  std::uint64_t others_throttled = 0;
  for (std::size_t j = 0; j < now.size(); ++j)
    if (j != i) {
      others.push_back(share(j));
      others_throttled = std::max(others_throttled, delta(now[j].throttled_us, base[j].throttled_us));
    }
  std::string out;
  if (const double mine = share(i); mine >= 0.05 && mine > 2 * median(others) + 0.02)
    out += fmt::format("; its cpu is shared: it waited for one {:.0f}% as long as it ran", mine * 100);
  if (const auto throttled = delta(now[i].throttled_us, base[i].throttled_us); throttled > 2 * others_throttled + 1000)
    out += fmt::format("; its cgroup's cpu.max held it back for {:.0f} ms", static_cast<double>(throttled) / 1e3);
  if (const auto faults = delta(now[i].major_faults, base[i].major_faults); faults >= 100)
    out += fmt::format("; it read {} pages in from disk (memory pressure?)", faults);
  return out;
}

}  // namespace

// The readings compared: `base` (an earlier reading of the same ranks) and now; `count` steps
// (or calls, where `steps` is false) the window holds for the rank that did the fewest.
struct StragglerDetector::Window {
  const std::vector<WorkSample>* base = nullptr;
  bool steps = false;
  std::uint64_t count = 0;
};

namespace {

std::uint64_t fewest(const std::vector<WorkSample>& now, const std::vector<WorkSample>& h,
                     std::uint64_t WorkSample::*field) {
  std::uint64_t least = ~std::uint64_t{0};
  for (std::size_t i = 0; i < now.size(); ++i) least = std::min(least, delta(now[i].*field, h[i].*field));
  return least;
}

// Each rank's own work a call in the window, in ms, where the program marks no steps.
std::vector<double> call_work(const std::vector<WorkSample>& now, const std::vector<WorkSample>& base) {
  std::vector<double> work(now.size());
  for (std::size_t i = 0; i < now.size(); ++i) {
    const auto calls = delta(now[i].gaps, base[i].gaps);
    work[i] = calls == 0 ? 0 : static_cast<double>(delta(now[i].gap_ns, base[i].gap_ns)) / static_cast<double>(calls) / 1e6;
  }
  return work;
}

}  // namespace

// The windows to judge, shortest first: with steps, the last first_steps (where an excess of
// twice the threshold is enough), twice as many, and window_steps (or as many as there are);
// without, every reading kept.
std::vector<StragglerDetector::Window> StragglerDetector::windows(const std::vector<WorkSample>& now) const {
  std::vector<Window> out;
  if (history_.size() < 2) return out;
  const bool stepping = fewest(now, history_.front(), &WorkSample::steps) > 0;
  if (!stepping) {
    if (const auto calls = fewest(now, history_.front(), &WorkSample::gaps); calls >= kLeastCalls)
      out.push_back({&history_.front(), false, calls});
    return out;
  }
  for (const auto want : {options_.first_steps, 2 * options_.first_steps, options_.window_steps}) {
    // The newest earlier reading with `want` steps since, else the oldest.
    const std::vector<WorkSample>* base = &history_.front();
    for (auto it = history_.rbegin() + 1; it != history_.rend(); ++it)
      if (fewest(now, *it, &WorkSample::steps) >= want) {
        base = &*it;
        break;
      }
    const auto count = fewest(now, *base, &WorkSample::steps);
    if (count >= options_.first_steps && (out.empty() || out.back().base != base) &&
        fewest(now, *base, &WorkSample::gaps) > 0)  // a rank with no work measured: unknown
      out.push_back({base, true, count});
  }
  return out;
}

// Each rank's own work a step in the window from `base` to now, in ms: the median of its
// readings' (each over the steps since the reading before), not the mean, so that a single long
// step of a healthy rank (a late wake-up: 2-6 ms on a busy machine) does not raise the median
// the others are compared with and hide a rank that is slower at every step.
std::vector<double> StragglerDetector::step_work(const std::vector<WorkSample>& base) const {
  auto from = std::find_if(history_.begin(), history_.end(), [&](const auto& h) { return &h == &base; });
  std::vector<std::vector<double>> readings(history_.back().size());
  for (auto a = from; a != history_.end() && std::next(a) != history_.end(); ++a) {
    const auto& b = *std::next(a);
    for (std::size_t i = 0; i < readings.size(); ++i)
      if (const auto steps = delta(b[i].steps, (*a)[i].steps); steps > 0)
        readings[i].push_back(static_cast<double>(delta(b[i].step_work_ns, (*a)[i].step_work_ns)) /
                              static_cast<double>(steps) / 1e6);
  }
  std::vector<double> work(readings.size());
  for (std::size_t i = 0; i < readings.size(); ++i) work[i] = readings[i].empty() ? 0 : median(readings[i]);
  return work;
}

void StragglerDetector::reset() {
  history_.clear();
  named_.clear();
}

std::vector<std::string> StragglerDetector::observe(const std::vector<WorkSample>& now) {
  std::vector<std::string> lines;
  if (now.size() < 2) return lines;
  // A program's first steps are not the ones to judge: its first calls set up, and its timing of
  // every call starts with its steps (rank_metrics.hpp).
  const auto least_steps = std::min_element(now.begin(), now.end(), [](const auto& a, const auto& b) {
                             return a.steps < b.steps;
                           })->steps;
  const bool stepping = std::any_of(now.begin(), now.end(), [](const auto& s) { return s.steps > 0; });
  if (stepping && least_steps < kWarmUpSteps) return lines;
  if (!history_.empty() && !same_ranks(history_.back(), now)) reset();  // a re-form, an attempt
  history_.push_back(now);
  if (history_.size() > kMostReadings) history_.pop_front();
  const auto ws = windows(now);
  if (ws.empty()) return lines;
  std::vector<std::vector<double>> works, sorted;
  for (const auto& w : ws) {
    works.push_back(w.steps ? step_work(*w.base) : call_work(now, *w.base));
    sorted.push_back(works.back());
    std::sort(sorted.back().begin(), sorted.back().end());
  }
  for (std::size_t i = 0; i < now.size(); ++i) {
    const int rank = now[i].rank;
    for (std::size_t k = 0; k < ws.size(); ++k) {
      const auto& w = ws[k];
      const auto& work = works[k];
      const double ref = median_without(sorted[k], work[i]);
      const double excess = ref > 0 ? work[i] / ref - 1 : 0;
      if (named_.contains(rank)) {  // over once the longest window is back under half the threshold
        if (&w == &ws.back() && w.count >= options_.window_steps && excess < options_.threshold / 2) named_.erase(rank);
        continue;
      }
      const double needed = w.steps && w.count < 2 * options_.first_steps ? 2 * options_.threshold : options_.threshold;
      const double least = w.steps ? options_.least_ms : options_.least_ms / 100;  // a call: 5 us
      // To the percent the line says it in: a rank said to take 10% longer meets a threshold of 10%.
      if (std::round(excess * 100) < std::round(needed * 100) || work[i] - ref < least) continue;
      named_[rank] = excess;
      lines.push_back(fmt::format("straggler: rank {} ({}) takes {:.0f}% longer than the median between collectives "
                                  "over the last {} {} ({} a {}){}",
                                  rank, now[i].host, excess * 100, w.count, w.steps ? "steps" : "calls",
                                  common::compared_times_text(Ms(work[i]), Ms(ref)),
                                  w.steps ? "step" : "call", cause(now, *w.base, i)));
      break;
    }
  }
  // Readings older than the longest window's base are needed no more.
  while (&history_.front() != ws.back().base) history_.pop_front();
  return lines;
}

std::string samples_to_json(const std::vector<WorkSample>& samples) {
  auto out = nlohmann::json::array();
  for (const auto& s : samples)
    out.push_back({{"rank", s.rank}, {"pid", s.pid}, {"host", s.host}, {"steps", s.steps},
                   {"step_work_ns", s.step_work_ns}, {"gaps", s.gaps}, {"gap_ns", s.gap_ns}, {"run_ns", s.run_ns},
                   {"wait_ns", s.wait_ns}, {"major_faults", s.major_faults}, {"throttled_us", s.throttled_us}});
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::optional<std::vector<WorkSample>> samples_from_json(const std::string& text) {
  try {
    std::vector<WorkSample> out;
    for (const auto& j : nlohmann::json::parse(text))
      out.push_back({.rank = j.at("rank"), .pid = j.at("pid"), .host = j.at("host"), .steps = j.at("steps"),
                     .step_work_ns = j.at("step_work_ns"), .gaps = j.at("gaps"), .gap_ns = j.at("gap_ns"),
                     .run_ns = j.at("run_ns"), .wait_ns = j.at("wait_ns"), .major_faults = j.at("major_faults"),
                     .throttled_us = j.at("throttled_us")});
    return out;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace idist::launchers::detail
