#include "job_stragglers.hpp"

#include <algorithm>

namespace idist::launchers::rendezvous {

namespace {
// Nodes share about four times a second each: compared at most ten times a second, as one
// node's watch reads its own ranks.
constexpr auto kCompareEvery = std::chrono::milliseconds(100);
// A node's samples count this long: it shares every 250 ms.
constexpr auto kFresh = std::chrono::seconds(2);
}  // namespace

std::optional<JobStragglers::Said> JobStragglers::heard(int attempt, int node, double threshold,
                                                        std::vector<launchers::detail::WorkSample> samples,
                                                        const std::set<int>& running) {
  if (attempt != attempt_ || !detector_) {  // a new attempt: its ranks compared afresh
    attempt_ = attempt;
    detector_.emplace(launchers::detail::StragglerOptions{.threshold = threshold});
    latest_.clear();
    retell_ = !told_.empty();
    told_.clear();
  }
  const auto now = std::chrono::steady_clock::now();
  latest_[node] = {std::move(samples), now};
  std::erase_if(latest_, [&](const auto& kv) { return !running.contains(kv.first) || now - kv.second.at > kFresh; });
  if (now < next_) return std::nullopt;
  next_ = now + kCompareEvery;
  std::vector<launchers::detail::WorkSample> all;
  for (const auto& [n, s] : latest_) all.insert(all.end(), s.samples.begin(), s.samples.end());
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  Said said{.lines = detector_->observe(all), .named = detector_->current()};
  if (said.lines.empty() && said.named == told_ && !retell_) return std::nullopt;
  told_ = said.named;
  retell_ = false;
  return said;
}

}  // namespace idist::launchers::rendezvous
