// auto_dataloader's parts: the sampler over idist::DistributedSampler, and ignite's division
// of the batch size and the workers among the ranks.
#include <torch/serialize/archive.h>

#include "idist/torch.hpp"
#include "torch_errors.hpp"

namespace idist {

TorchDistributedSampler::TorchDistributedSampler(const DistributedSamplerOptions& options)
    : options_(options), sampler_(options) {}

void TorchDistributedSampler::set_epoch(std::uint64_t epoch) {
  sampler_.set_epoch(epoch);
  epoch_set_ = true;
}

void TorchDistributedSampler::reset(c10::optional<std::size_t> new_size) {
  if (new_size && *new_size != options_.dataset_size) {
    options_.dataset_size = *new_size;
    const auto epoch = sampler_.epoch();
    sampler_ = DistributedSampler(options_);
    sampler_.set_epoch(epoch);
  }
  // The data loader resets once per epoch (its begin()): the next epoch, unless one was set.
  if (started_ && !epoch_set_) sampler_.set_epoch(sampler_.epoch() + 1);
  started_ = true;
  epoch_set_ = false;
  indices_ = sampler_.indices();
  position_ = 0;
}

c10::optional<std::vector<std::size_t>> TorchDistributedSampler::next(std::size_t batch_size) {
  if (position_ >= indices_.size()) return c10::nullopt;
  const auto end = std::min(indices_.size(), position_ + batch_size);
  std::vector<std::size_t> batch(indices_.begin() + static_cast<std::ptrdiff_t>(position_),
                                 indices_.begin() + static_cast<std::ptrdiff_t>(end));
  position_ = end;
  return batch;
}

void TorchDistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("epoch", torch::tensor(static_cast<std::int64_t>(sampler_.epoch())), /*is_buffer=*/true);
  archive.write("position", torch::tensor(static_cast<std::int64_t>(position_)), /*is_buffer=*/true);
}

void TorchDistributedSampler::load(torch::serialize::InputArchive& archive) {
  auto epoch = torch::empty(1, torch::kInt64);
  auto position = torch::empty(1, torch::kInt64);
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("position", position, /*is_buffer=*/true);
  sampler_.set_epoch(static_cast<std::uint64_t>(epoch.item<std::int64_t>()));
  indices_ = sampler_.indices();
  position_ = static_cast<std::size_t>(position.item<std::int64_t>());
  started_ = true;
  epoch_set_ = true;  // the next reset() resumes this epoch
}

namespace detail {

std::size_t rank_batch_size(std::size_t global_batch) {
  const auto n = static_cast<std::size_t>(get_world_size());
  if (global_batch == 0) refuse("auto_dataloader", "batch_size is 0");
  if (global_batch % n != 0)
    refuse("auto_dataloader", "batch_size " + std::to_string(global_batch) + " is not divisible by the world size " +
                                  std::to_string(n) + ": each rank loads batch_size / world size samples, so pass a "
                                  "multiple of it (e.g. " + std::to_string((global_batch / n + 1) * n) + ")");
  return global_batch / n;
}

std::size_t rank_workers(std::size_t num_workers) {
  const auto per_node = static_cast<std::size_t>(std::max(1, get_nproc_per_node()));
  return (num_workers + per_node - 1) / per_node;
}

}  // namespace detail
}  // namespace idist
