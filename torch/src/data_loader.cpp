// auto_dataloader's parts: the sampler over idist::DistributedSampler, and ignite's division
// of the batch size and the workers among the ranks.
#include <torch/serialize/archive.h>

#include <map>
#include <mutex>
#include <optional>

#include "idist/torch.hpp"
#include "torch_errors.hpp"

namespace idist {

struct TorchDistributedSampler::State {
  explicit State(const DistributedSamplerOptions& o) : options(o), sampler(o) {}
  DistributedSamplerOptions options;
  DistributedSampler sampler;
  std::vector<std::size_t> indices;
  std::size_t position = 0;
  bool started = false;                    // the first reset() is epoch 0 (or the one set)
  bool epoch_set = false;                  // set_epoch() or load() since the last reset()
  std::optional<std::size_t> resume_at;    // load(): where the next reset() resumes
  std::mutex mu;                           // the loader's thread and Checkpoint's
};

TorchDistributedSampler::TorchDistributedSampler(const DistributedSamplerOptions& options)
    : state_(std::make_shared<State>(options)) {}

void TorchDistributedSampler::set_epoch(std::uint64_t epoch) {
  std::lock_guard lock(state_->mu);
  state_->sampler.set_epoch(epoch);
  state_->epoch_set = true;
  state_->resume_at.reset();
}

std::uint64_t TorchDistributedSampler::epoch() const {
  std::lock_guard lock(state_->mu);
  return state_->sampler.epoch();
}

std::size_t TorchDistributedSampler::size() const {
  std::lock_guard lock(state_->mu);
  return state_->sampler.size();
}

void TorchDistributedSampler::reset(c10::optional<std::size_t> new_size) {
  auto& s = *state_;
  std::lock_guard lock(s.mu);
  if (new_size && *new_size != s.options.dataset_size) {
    s.options.dataset_size = *new_size;
    const auto epoch = s.sampler.epoch();
    s.sampler = DistributedSampler(s.options);
    s.sampler.set_epoch(epoch);
  }
  // The data loader resets once per epoch (its begin()): the next epoch, unless one was set.
  if (s.started && !s.epoch_set) s.sampler.set_epoch(s.sampler.epoch() + 1);
  s.started = true;
  s.epoch_set = false;
  s.indices = s.sampler.indices();
  s.position = std::min(s.resume_at.value_or(0), s.indices.size());
  s.resume_at.reset();
}

c10::optional<std::vector<std::size_t>> TorchDistributedSampler::next(std::size_t batch_size) {
  auto& s = *state_;
  std::lock_guard lock(s.mu);
  if (s.position >= s.indices.size()) return c10::nullopt;
  const auto end = std::min(s.indices.size(), s.position + batch_size);
  std::vector<std::size_t> batch(s.indices.begin() + static_cast<std::ptrdiff_t>(s.position),
                                 s.indices.begin() + static_cast<std::ptrdiff_t>(end));
  s.position = end;
  return batch;
}

void TorchDistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  std::lock_guard lock(state_->mu);
  // An epoch read to its end resumes at the next one's start.
  const bool done = state_->started && state_->position >= state_->indices.size();
  const auto epoch = state_->sampler.epoch() + (done ? 1 : 0);
  const auto position = done ? 0 : state_->position;
  archive.write("epoch", torch::tensor(static_cast<std::int64_t>(epoch)), /*is_buffer=*/true);
  archive.write("position", torch::tensor(static_cast<std::int64_t>(position)), /*is_buffer=*/true);
}

void TorchDistributedSampler::load(torch::serialize::InputArchive& archive) {
  auto epoch = torch::empty(1, torch::kInt64);
  auto position = torch::empty(1, torch::kInt64);
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("position", position, /*is_buffer=*/true);
  std::lock_guard lock(state_->mu);
  state_->sampler.set_epoch(static_cast<std::uint64_t>(epoch.item<std::int64_t>()));
  state_->epoch_set = true;  // the next reset() (the loader's begin()) resumes this epoch, there
  state_->resume_at = static_cast<std::size_t>(position.item<std::int64_t>());
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

namespace {
std::mutex samplers_mu;
std::map<const void*, std::weak_ptr<TorchDistributedSampler::State>>& samplers() {
  static std::map<const void*, std::weak_ptr<TorchDistributedSampler::State>> by_loader;
  return by_loader;
}
}  // namespace

void remember_sampler(const void* loader, const TorchDistributedSampler& sampler) {
  std::lock_guard lock(samplers_mu);
  auto& map = samplers();
  std::erase_if(map, [](const auto& entry) { return entry.second.expired(); });
  map[loader] = sampler.state_;
}

std::unique_ptr<TorchDistributedSampler> loader_sampler(const void* loader) {
  std::lock_guard lock(samplers_mu);
  const auto it = samplers().find(loader);
  if (it == samplers().end()) return nullptr;
  auto state = it->second.lock();
  if (!state) return nullptr;
  return std::unique_ptr<TorchDistributedSampler>(new TorchDistributedSampler(std::move(state)));
}

std::size_t rank_workers(std::size_t num_workers) {
  const auto per_node = static_cast<std::size_t>(std::max(1, get_nproc_per_node()));
  return (num_workers + per_node - 1) / per_node;
}

}  // namespace detail
}  // namespace idist
