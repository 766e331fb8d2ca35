#include "job_stragglers.hpp"

#include <algorithm>

namespace idist::launchers::rendezvous {

namespace {
// Nodes share about four times a second each: compared at most ten times a second, as one
// node's watch reads its own ranks.
constexpr auto kCompareEvery = std::chrono::milliseconds(100);
}  // namespace

std::optional<JobStragglers::Said> JobStragglers::heard(int attempt, int node, double threshold,
                                                        std::vector<launchers::detail::WorkSample> samples,
                                                        const std::vector<int>& members) {
  if (attempt != attempt_ || !detector_) {  // a new attempt: its ranks compared afresh
    attempt_ = attempt;
    detector_.emplace(launchers::detail::StragglerOptions{.threshold = threshold});
    latest_.clear();
    told_.clear();
  }
  latest_[node] = std::move(samples);
  std::erase_if(latest_, [&](const auto& kv) { return std::find(members.begin(), members.end(), kv.first) == members.end(); });
  if (latest_.size() < members.size()) return std::nullopt;  // a member not heard yet: its ranks would look gone
  const auto now = std::chrono::steady_clock::now();
  if (now < next_) return std::nullopt;
  next_ = now + kCompareEvery;
  std::vector<launchers::detail::WorkSample> all;
  for (const auto& [n, s] : latest_) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  Said said{.lines = detector_->observe(all), .named = detector_->current()};
  if (said.lines.empty() && said.named == told_) return std::nullopt;
  told_ = said.named;
  return said;
}

}  // namespace idist::launchers::rendezvous
