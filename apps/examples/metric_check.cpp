// The DDP metric test pattern (Sangho Lee's internship post): every rank draws its own
// random predictions and targets, computes the metrics the distributed way (local sums, one
// all_reduce), and checks them against a reference computed on the data all_gather'ed from
// every rank. The three items of that post: data differs between ranks, every rank computes
// the reference on the same gathered data, and the two values agree.
#include <idist/idist.hpp>

#include <algorithm>
#include <cmath>
#include <random>

#include "print.hpp"

namespace {

struct Metrics {
  double accuracy;  // of the thresholded predictions
  double mse;       // of the raw predictions
};

// The reference, as scikit-learn would compute it, on one process's worth of data.
Metrics reference(const std::vector<float>& predictions, const std::vector<std::int32_t>& targets) {
  std::size_t correct = 0;
  double squared = 0.0;
  for (std::size_t i = 0; i < predictions.size(); ++i) {
    correct += (predictions[i] >= 0.5f) == (targets[i] == 1) ? 1 : 0;
    const double e = static_cast<double>(predictions[i]) - targets[i];
    squared += e * e;
  }
  const auto n = static_cast<double>(predictions.size());
  return {static_cast<double>(correct) / n, squared / n};
}

}  // namespace

int main() try {
  idist::init();
  const int rank = idist::get_rank();
  const auto who = "Rank " + std::to_string(rank);

  // Seeded by rank, so each rank has different data, and a different amount of it.
  std::mt19937_64 gen(1000 + static_cast<std::uint64_t>(rank));
  const std::size_t n = 100 + 17 * static_cast<std::size_t>(rank);
  std::vector<float> predictions(n);
  std::vector<std::int32_t> targets(n);
  for (std::size_t i = 0; i < n; ++i) {
    targets[i] = static_cast<std::int32_t>(gen() % 2);
    // A mediocre classifier: right more often than not.
    const float noise = static_cast<float>(gen() % 1000) / 1000.0f;
    predictions[i] = targets[i] == 1 ? 0.3f + 0.7f * noise : 0.7f * noise;
  }

  // 1. The data differs between ranks (else the check below proves nothing).
  const auto firsts = idist::all_gather(predictions[0]);
  std::vector<float> sorted = firsts;
  std::sort(sorted.begin(), sorted.end());
  const bool distinct = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();

  // The distributed way: local sums, reduced once (counts as int64, exact; errors as double).
  std::vector<std::int64_t> counts = {0, static_cast<std::int64_t>(n)};
  std::vector<double> squared = {0.0};
  for (std::size_t i = 0; i < n; ++i) {
    counts[0] += (predictions[i] >= 0.5f) == (targets[i] == 1) ? 1 : 0;
    const double e = static_cast<double>(predictions[i]) - targets[i];
    squared[0] += e * e;
  }
  idist::all_reduce(counts);
  idist::all_reduce(squared);
  const auto total = static_cast<double>(counts[1]);
  const Metrics distributed{static_cast<double>(counts[0]) / total, squared[0] / total};

  // 2. The reference on everything, gathered (lengths differ between ranks: all_gather copes).
  const Metrics ref = reference(idist::all_gather(predictions), idist::all_gather(targets));

  // 3. They agree: accuracy exactly, the MSE up to the order of the additions.
  const bool ok = distinct && distributed.accuracy == ref.accuracy &&
                  std::abs(distributed.mse - ref.mse) <= 1e-12 * std::max(1.0, ref.mse);
  examples::say(who + ", " + std::to_string(counts[1]) + " samples: accuracy " + examples::repr(distributed.accuracy) +
                " (distributed) vs " + examples::repr(ref.accuracy) + " (gathered), mse " +
                examples::repr(distributed.mse) + " vs " + examples::repr(ref.mse) +
                (ok ? " (ok)" : distinct ? " (MISMATCH)" : " (ranks drew the same data)"));
  idist::finalize();
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
