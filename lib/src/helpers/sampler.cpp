// DistributedSampler and the per-rank batch size: what ignite's auto_dataloader sets up.
#include <random>
#include <string>

#include "idist/helpers.hpp"

namespace idist {

namespace {

// A uniform integer in [0, bound) from the generator's raw 64-bit output. Rejection of the
// few low values that would bias the modulo (the threshold is 2^64 mod bound) keeps it exact;
// std::uniform_int_distribution is not used because its algorithm differs between standard
// libraries, and every rank must draw the same permutation.
std::uint64_t uniform_below(std::mt19937_64& gen, std::uint64_t bound) {
  const std::uint64_t threshold = (0 - bound) % bound;
  std::uint64_t x = gen();
  while (x < threshold) x = gen();
  return x % bound;
}

}  // namespace

std::vector<std::size_t> permutation(std::size_t n, std::uint64_t seed) {
  std::vector<std::size_t> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = i;
  std::mt19937_64 gen(seed);
  for (std::size_t i = n; i > 1; --i) std::swap(p[i - 1], p[uniform_below(gen, i)]);
  return p;
}

DistributedSampler::DistributedSampler(const DistributedSamplerOptions& options)
    : dataset_size_(options.dataset_size),
      num_replicas_(options.num_replicas.value_or(get_world_size())),
      rank_(options.rank.value_or(get_rank())),
      shuffle_(options.shuffle),
      seed_(options.seed) {
  if (num_replicas_ < 1)
    detail::refuse("DistributedSampler", "num_replicas=" + std::to_string(num_replicas_) + " must be at least 1");
  if (rank_ < 0 || rank_ >= num_replicas_)
    detail::refuse("DistributedSampler",
                   "rank=" + std::to_string(rank_) + " is not in [0, " + std::to_string(num_replicas_) + ")");
  const auto replicas = static_cast<std::size_t>(num_replicas_);
  // torch: ceil((n - R) / R) with drop_last (that is n / R rounded down, 0 when n < R),
  // ceil(n / R) without.
  num_samples_ = options.drop_last ? dataset_size_ / replicas : (dataset_size_ + replicas - 1) / replicas;
}

std::vector<std::size_t> DistributedSampler::indices() const {
  const std::vector<std::size_t> order =
      shuffle_ ? permutation(dataset_size_, seed_ + epoch_) : std::vector<std::size_t>{};
  const auto replicas = static_cast<std::size_t>(num_replicas_);
  std::vector<std::size_t> mine(num_samples_);
  for (std::size_t k = 0; k < num_samples_; ++k) {
    // Position in the padded (or cut) list; padding repeats the list from its start,
    // cyclically when it is shorter than the padding (fewer samples than ranks).
    const std::size_t position = (static_cast<std::size_t>(rank_) + k * replicas) % dataset_size_;
    mine[k] = shuffle_ ? order[position] : position;
  }
  return mine;
}

std::size_t per_rank_batch_size(std::size_t global_batch, int world_size) {
  if (world_size < 1)
    detail::refuse("per_rank_batch_size", "world_size=" + std::to_string(world_size) + " must be at least 1");
  if (global_batch < static_cast<std::size_t>(world_size))
    detail::refuse("per_rank_batch_size", "global batch " + std::to_string(global_batch) +
                                              " is smaller than the world size " + std::to_string(world_size) +
                                              ": every rank needs at least one sample");
  return global_batch / static_cast<std::size_t>(world_size);
}

std::size_t per_rank_batch_size(std::size_t global_batch) {
  return per_rank_batch_size(global_batch, get_world_size());
}

}  // namespace idist
