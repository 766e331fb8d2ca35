// auto_dataloader's parts: the sampler over idist::DistributedSampler, and ignite's division
// of the batch size and the workers among the ranks.
#include <torch/serialize/archive.h>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>

#include "batch_weight.hpp"
#include "recovery_parts.hpp"
#include "idist/torch.hpp"
#include "torch_errors.hpp"

namespace idist {
namespace {

// Shares of a global batch the world size does not divide: rank r takes `share` samples at
// `offset` of each global batch (the first global % world ranks one more: numpy's array_split).
struct Shares {
  std::size_t global = 0;  // 0: the world size divides the batch; DistributedSampler's split
  std::size_t share = 0;
  std::size_t offset = 0;
};

Shares shares_of(std::size_t global_batch, int rank, int world) {
  const auto w = static_cast<std::size_t>(world), r = static_cast<std::size_t>(rank);
  if (global_batch == 0 || world < 2 || global_batch % w == 0) return {};
  const auto base = global_batch / w, extra = global_batch % w;
  return {global_batch, base + (r < extra ? 1 : 0), r * base + std::min(r, extra)};
}

// This rank's indices for an epoch, in shares: the permutation padded from its start to whole
// global batches (or cut, with drop_last), then this rank's slice of each.
std::vector<std::size_t> shared_indices(const DistributedSamplerOptions& o, const Shares& s, std::uint64_t epoch) {
  auto order = o.shuffle ? permutation(o.dataset_size, o.seed + epoch) : std::vector<std::size_t>();
  if (!o.shuffle)
    for (std::size_t i = 0; i < o.dataset_size; ++i) order.push_back(i);
  if (order.empty()) return {};
  const auto batches = o.drop_last ? order.size() / s.global : (order.size() + s.global - 1) / s.global;
  std::vector<std::size_t> mine;
  mine.reserve(batches * s.share);
  for (std::size_t b = 0; b < batches; ++b)
    for (std::size_t i = 0; i < s.share; ++i) mine.push_back(order[(b * s.global + s.offset + i) % order.size()]);
  return mine;
}

}  // namespace

struct TorchDistributedSampler::State {
  State(const DistributedSamplerOptions& o, Shares s, std::size_t global)
      : options(o), sampler(o), shares(s), global_batch(global) {}
  DistributedSamplerOptions options;
  DistributedSampler sampler;
  Shares shares;
  std::size_t global_batch = 0;            // auto_dataloader's batch_size (0: not given)
  std::vector<std::size_t> indices;
  std::size_t position = 0;
  bool started = false;                    // the first reset() is epoch 0 (or the one set)
  bool epoch_set = false;                  // set_epoch() or load() since the last reset()
  std::optional<std::uint64_t> resume_at;  // load(): where the next reset() resumes (a global position)
  bool follow_world = false;               // a re-form: the next reset() splits over the new world
  bool rescaled = false;                   // split over another world than the loader's batch size's
  std::mutex mu;                           // the loader's thread and Checkpoint's
  std::uint64_t global_position() const;
  std::size_t local_position(std::uint64_t global) const;
};

TorchDistributedSampler::TorchDistributedSampler(const DistributedSamplerOptions& options, std::size_t global_batch)
    : state_(std::make_shared<State>(options, shares_of(global_batch, options.rank.value_or(get_rank()),
                                                         options.num_replicas.value_or(get_world_size())),
                                     global_batch)) {}

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
  if (state_->shares.global != 0) return shared_indices(state_->options, state_->shares, 0).size();
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
  // A loader made before a re-form (an evaluation's) splits its next epoch over the new world;
  // Recovery re-splits the training loader itself, mid-epoch (SamplerAccess::resplit).
  if (s.follow_world) {
    const auto epoch = s.sampler.epoch();
    s.sampler = DistributedSampler(s.options);
    s.sampler.set_epoch(epoch);
    s.shares = shares_of(s.global_batch, get_rank(), get_world_size());
    s.follow_world = false;
    s.rescaled = true;
  }
  // The data loader resets once per epoch (its begin()): the next epoch, unless one was set.
  if (s.started && !s.epoch_set) s.sampler.set_epoch(s.sampler.epoch() + 1);
  s.started = true;
  s.epoch_set = false;
  s.indices = s.shares.global != 0 ? shared_indices(s.options, s.shares, s.sampler.epoch()) : s.sampler.indices();
  s.position = std::min(s.local_position(s.resume_at.value_or(0)), s.indices.size());
  s.resume_at.reset();
}

c10::optional<std::vector<std::size_t>> TorchDistributedSampler::next(std::size_t batch_size) {
  auto& s = *state_;
  std::lock_guard lock(s.mu);
  if (s.position >= s.indices.size()) return c10::nullopt;
  // auto_model weighs this rank's gradients by its share of the batch it is about to train on.
  detail::set_batch_weight(s.shares.global == 0 ? 1.0
                                                : static_cast<double>(s.shares.share) *
                                                      static_cast<double>(s.sampler.num_replicas()) /
                                                      static_cast<double>(s.shares.global));
  // The loader asks for the batch of the world it was made in; a re-form changed that.
  const auto asked = batch_size;
  if (s.shares.global != 0) batch_size = s.shares.share;
  else if (s.rescaled && s.global_batch != 0) batch_size = s.global_batch / static_cast<std::size_t>(s.sampler.num_replicas());
  if (s.rescaled && s.options.drop_last && batch_size < asked)
    detail::refuse("Recovery", "after the re-form this rank's share of the global batch (" + std::to_string(batch_size) +
                           ") is below the loader's batch (" + std::to_string(asked) +
                           "), which drop_last would drop: use a global batch of at least world x (world - 1)");
  const auto end = std::min(s.indices.size(), s.position + batch_size);
  std::vector<std::size_t> batch(s.indices.begin() + static_cast<std::ptrdiff_t>(s.position),
                                 s.indices.begin() + static_cast<std::ptrdiff_t>(end));
  s.position = end;
  return batch;
}

// The place in an epoch is kept as samples of the permutation used by all ranks together, which
// a job restarted at another world size maps to its own ranks: rank r's p samples are p x world
// of the permutation (DistributedSampler's interleaved split), or p / share global batches.
std::uint64_t TorchDistributedSampler::State::global_position() const {
  if (shares.global != 0) return position / shares.share * shares.global;
  return position * static_cast<std::uint64_t>(sampler.num_replicas());
}

std::size_t TorchDistributedSampler::State::local_position(std::uint64_t global) const {
  if (shares.global != 0) return global / shares.global * shares.share;
  return global / static_cast<std::uint64_t>(sampler.num_replicas());
}

void TorchDistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  std::lock_guard lock(state_->mu);
  // An epoch read to its end resumes at the next one's start.
  const bool done = state_->started && state_->position >= state_->indices.size();
  const auto epoch = state_->sampler.epoch() + (done ? 1 : 0);
  const auto global = done ? 0 : state_->global_position();
  archive.write("epoch", torch::tensor(static_cast<std::int64_t>(epoch)), /*is_buffer=*/true);
  archive.write("global_position", torch::tensor(static_cast<std::int64_t>(global)), /*is_buffer=*/true);
}

void TorchDistributedSampler::load(torch::serialize::InputArchive& archive) {
  auto epoch = torch::empty(1, torch::kInt64);
  auto global = torch::empty(1, torch::kInt64);
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("global_position", global, /*is_buffer=*/true);
  std::lock_guard lock(state_->mu);
  state_->sampler.set_epoch(static_cast<std::uint64_t>(epoch.item<std::int64_t>()));
  state_->epoch_set = true;  // the next reset() (the loader's begin()) resumes this epoch, there
  state_->resume_at = static_cast<std::uint64_t>(global.item<std::int64_t>());
}

namespace detail {

SamplerMark SamplerAccess::mark(const TorchDistributedSampler& sampler) {
  auto& s = *sampler.state_;
  std::lock_guard lock(s.mu);
  if (!s.started) return {.epoch = s.sampler.epoch(), .global = s.resume_at.value_or(0), .at_end = false};
  return {.epoch = s.sampler.epoch(), .global = s.global_position(), .at_end = s.position >= s.indices.size()};
}

// The split a loader made for the new world would have: global batch b is the same samples of
// the permutation at any world size (with drop_last; without it only the epoch's last batch
// differs), so the batches left in the epoch are those the old world had left, split over the
// new one exactly as a job restarted on it from a checkpoint splits them.
void SamplerAccess::resplit(const TorchDistributedSampler& sampler, const SamplerMark& at) {
  auto& s = *sampler.state_;
  std::lock_guard lock(s.mu);
  if (s.global_batch == 0) refuse("Recovery", "the loader's sampler has no global batch size to split");
  s.shares = shares_of(s.global_batch, get_rank(), get_world_size());
  s.rescaled = true;
  s.follow_world = false;
  const auto epoch = s.sampler.epoch();
  s.sampler = DistributedSampler(s.options);  // auto_dataloader's: the rank and world of now
  s.sampler.set_epoch(epoch);
  if (!s.started) {  // the loader has not begun: its begin() resumes at the mark, as after load()
    // A mark at an epoch's end: the others have begun the next (a replacement joins them there).
    s.sampler.set_epoch(at.at_end ? at.epoch + 1 : at.epoch);
    s.epoch_set = true;
    s.resume_at = at.at_end ? 0 : at.global;
    return;
  }
  s.indices = s.shares.global != 0 ? shared_indices(s.options, s.shares, epoch) : s.sampler.indices();
  if (at.epoch == epoch) {
    s.position = at.at_end ? s.indices.size() : std::min(s.local_position(at.global), s.indices.size());
  } else if (at.epoch + 1 == epoch && at.at_end) {
    s.position = 0;  // this rank began the next epoch; nothing of it was kept
  } else {
    refuse("Recovery", "internal: the ranks' loaders are in epochs " + std::to_string(at.epoch) + " and " +
                           std::to_string(epoch) + ", more than one step apart");
  }
}

std::size_t rank_batch_size(std::size_t global_batch) {
  const auto n = static_cast<std::size_t>(get_world_size());
  if (global_batch == 0) refuse("auto_dataloader", "batch_size is 0");
  if (global_batch < n)
    refuse("auto_dataloader", "batch_size " + std::to_string(global_batch) + " is smaller than the world size " +
                                  std::to_string(n) + ": each rank loads a share of the batch, so pass at least " +
                                  std::to_string(n));
  if (global_batch % n == 0) return global_batch / n;
  return shares_of(global_batch, get_rank(), get_world_size()).share;
}

namespace {
std::atomic<double> weight{1.0};
}  // namespace

void set_batch_weight(double w) { weight.store(w, std::memory_order_relaxed); }
double batch_weight() { return weight.load(std::memory_order_relaxed); }

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

void SamplerAccess::follow_world() {
  std::lock_guard lock(samplers_mu);
  for (auto& [loader, weak] : samplers())
    if (auto state = weak.lock()) {
      std::lock_guard state_lock(state->mu);
      state->follow_world = true;
    }
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
