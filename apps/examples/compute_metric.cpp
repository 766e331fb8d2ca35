// "Collective Communication with Ignite", compute_metric: gather every rank's predictions
// and targets, let rank 0 compute the metric (here accuracy), and broadcast the result so
// that every rank has it.
#include <idist/idist.hpp>

#include <algorithm>

#include "print.hpp"

namespace {

constexpr std::int64_t kPerRank = 5;

// Accuracy of predicted classes against targets.
double compute_fn(const std::vector<std::int64_t>& predictions, const std::vector<std::int64_t>& targets) {
  std::size_t correct = 0;
  for (std::size_t i = 0; i < predictions.size(); ++i) correct += predictions[i] == targets[i] ? 1 : 0;
  return predictions.empty() ? 0.0 : static_cast<double>(correct) / static_cast<double>(predictions.size());
}

}  // namespace

int main() try {
  idist::init();
  const int rank = idist::get_rank();
  // Rank r holds samples r*5 .. r*5+4: the class is sample % 2, and the "model" errs on every
  // third sample.
  std::vector<std::int64_t> predictions, targets;
  for (std::int64_t i = 0; i < kPerRank; ++i) {
    const std::int64_t sample = rank * kPerRank + i;
    targets.push_back(sample % 2);
    predictions.push_back(sample % 3 == 0 ? 1 - sample % 2 : sample % 2);
  }

  const auto all_predictions = idist::all_gather(predictions);
  const auto all_targets = idist::all_gather(targets);
  double result = 0.0;
  if (rank == 0) result = compute_fn(all_predictions, all_targets);
  result = idist::broadcast(result, /*src=*/0);
  examples::say("Rank " + std::to_string(rank) + ", accuracy over " + std::to_string(all_targets.size()) +
                " samples: " + examples::repr(result));

  // Every rank holds rank 0's value, bit for bit.
  const auto everyone = idist::all_gather(result);
  idist::finalize();
  return std::all_of(everyone.begin(), everyone.end(), [&](double v) { return v == everyone[0]; }) ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
