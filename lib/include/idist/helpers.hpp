#pragma once
// ignite.distributed's helpers, and what auto_dataloader and auto_model do for a training
// loop, built on the collectives of idist.hpp:
//
//   idist::one_rank_only([&] { save_checkpoint(); }, {.rank = 0, .with_barrier = true});
//   auto data = idist::local_rank_first([&] { return load_or_download(path); });
//
//   idist::DistributedSampler sampler({.dataset_size = n, .seed = 42});
//   const auto batch = idist::per_rank_batch_size(global_batch);  // ignite's auto_dataloader
//   idist::GradientAverager averager;                              // DDP's bucketed all_reduce
//   for (int epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);
//     for (each batch of sampler.indices()) { forward/backward; averager.average(grads); step; }
//   }
//
// The helpers that communicate follow the ordering contract of idist.hpp: every rank calls
// them, in the same order, with matching arguments. A bad argument is an idist::Error, raised
// before anything is sent (errors.hpp).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "idist/idist.hpp"

namespace idist {

// --- one_rank_only ------------------------------------------------------------------------

struct OneRankOnlyOptions {
  int rank = 0;               // the global rank that runs fn
  bool with_barrier = false;  // then every rank waits until fn is done there (ignite's default: no)
};

namespace detail {
// Throws idist::Error "what(...): rank=R is not a rank (size_name N)" unless 0 <= rank < size.
IDIST_API void check_rank_in_range(const char* what, int rank, int size, const char* size_name);
}  // namespace detail

// ignite's @one_rank_only(rank, with_barrier): runs fn on one rank and returns its result
// there (std::nullopt elsewhere; nothing when fn returns void). Every rank must call it when
// with_barrier is set. If fn throws, the exception propagates on that rank without the
// barrier: the others wait until idist-run, seeing a rank fail, stops them (or IDIST_TIMEOUT).
template <class Fn>
auto one_rank_only(Fn&& fn, const OneRankOnlyOptions& options = {}) {
  using R = std::invoke_result_t<Fn&>;
  detail::check_rank_in_range("one_rank_only", options.rank, get_world_size(), "world size");
  const bool mine = get_rank() == options.rank;
  if constexpr (std::is_void_v<R>) {
    if (mine) fn();
    if (options.with_barrier) barrier();
  } else {
    std::optional<R> result;
    if (mine) result.emplace(fn());
    if (options.with_barrier) barrier();
    return result;
  }
}

// --- one_rank_first / local_rank_first ----------------------------------------------------

struct OneRankFirstOptions {
  int rank = 0;        // the rank that goes first: global, or local when `local` is set
  bool local = false;  // compare with get_local_rank(): one rank first on every node
};

// ignite's `with idist.one_rank_first(rank, local)`, which is the tutorial's get_datasets
// pattern: the chosen rank runs fn (the download) while all others wait at a barrier, then
// the others run fn (and find the files there). Every rank enters exactly one barrier, so
// calls stay matched. Returns fn's result on every rank.
//
// The barrier is global. With `local` over several nodes, local rank `rank` of every node
// goes first, and the rest wait for the slowest of those, not only for their own node's:
// right for a per-node download directory, and harmless otherwise. If fn throws on a rank
// that goes first, the others stay at the barrier until idist-run stops them (or
// IDIST_TIMEOUT); an exception on a later rank blocks no one.
template <class Fn>
decltype(auto) one_rank_first(Fn&& fn, const OneRankFirstOptions& options = {}) {
  const int me = options.local ? get_local_rank() : get_rank();
  const int size = options.local ? get_nproc_per_node() : get_world_size();
  detail::check_rank_in_range("one_rank_first", options.rank, size,
                              options.local ? "ranks per node" : "world size");
  const bool first = me == options.rank;
  if (!first) barrier();
  if constexpr (std::is_void_v<std::invoke_result_t<Fn&>>) {
    fn();
    if (first) barrier();
  } else {
    auto result = fn();
    if (first) barrier();
    return result;
  }
}

// Local rank 0 of every node first, then the others: the tutorial's download pattern.
template <class Fn>
decltype(auto) local_rank_first(Fn&& fn) {
  return one_rank_first(std::forward<Fn>(fn), OneRankFirstOptions{.rank = 0, .local = true});
}

// --- DistributedSampler -------------------------------------------------------------------

struct DistributedSamplerOptions {
  std::size_t dataset_size = 0;
  std::optional<int> num_replicas = std::nullopt;  // default: get_world_size()
  std::optional<int> rank = std::nullopt;          // default: get_rank()
  bool shuffle = true;
  std::uint64_t seed = 0;  // identical on every rank
  bool drop_last = false;
};

// torch.utils.data.DistributedSampler, which ignite's auto_dataloader puts under the data
// loader: this rank's share of a dataset's indices for one epoch.
//
// With shuffle, the indices are permuted by a Fisher-Yates shuffle driven by std::mt19937_64
// seeded with seed + epoch, with our own integer sampling, so every rank on every platform
// computes the same permutation (not torch's: torch.randperm uses another generator). Without
// drop_last the list is padded by repeating it from its start up to a multiple of
// num_replicas, so a few samples are repeated within an epoch; with drop_last its tail is cut
// down to a multiple instead, so a few are not seen that epoch. Rank r then takes every
// num_replicas-th index from position r, so all ranks get the same number of samples, and
// the first k samples of every rank together are the first k x num_replicas of the
// permutation: a global batch split exactly into per-rank batches. Throws idist::Error when
// num_replicas < 1 or rank is not in [0, num_replicas).
class IDIST_API DistributedSampler {
 public:
  explicit DistributedSampler(const DistributedSamplerOptions& options);

  // Call at the start of every epoch, else every epoch sees the same order.
  void set_epoch(std::uint64_t epoch) { epoch_ = epoch; }
  std::uint64_t epoch() const { return epoch_; }
  // This rank's indices for the current epoch, size() of them.
  std::vector<std::size_t> indices() const;
  // Samples per rank per epoch (torch's num_samples).
  std::size_t size() const { return num_samples_; }
  // size() x num_replicas: the dataset after padding or dropping.
  std::size_t total_size() const { return num_samples_ * static_cast<std::size_t>(num_replicas_); }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }

 private:
  std::size_t dataset_size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  std::uint64_t seed_;
  std::size_t num_samples_;
  std::uint64_t epoch_ = 0;
};

// The permutation of 0..n-1 that DistributedSampler uses for a seed (seed + epoch): the same
// on every platform.
IDIST_API std::vector<std::size_t> permutation(std::size_t n, std::uint64_t seed);

// ignite's auto_dataloader divides the batch size by the world size, so that a batch size
// written for one process stays the global batch: each rank loads global_batch / world_size
// samples (rounded down, as ignite does; the global batch is then that x world_size).
// Throws idist::Error when global_batch < world_size, where ignite would silently give every
// rank the whole global batch instead.
IDIST_API std::size_t per_rank_batch_size(std::size_t global_batch, int world_size);
IDIST_API std::size_t per_rank_batch_size(std::size_t global_batch);  // over get_world_size()

// --- GradientAverager ---------------------------------------------------------------------

// A run of consecutive buffers reduced by one collective: buffers [first, last), `bytes` in all.
struct Bucket {
  std::size_t first = 0;
  std::size_t last = 0;
  std::size_t bytes = 0;
  friend bool operator==(const Bucket&, const Bucket&) = default;
};

// How GradientAverager splits buffers of the given sizes (bytes) into buckets: in order, each
// bucket takes the next buffer while its total stays within cap_bytes. A buffer larger than
// the cap gets a bucket of its own, and a cap of 0 gives one bucket per buffer (the
// tutorial's average_gradients); empty buffers ride along with their neighbours.
IDIST_API std::vector<Bucket> plan_buckets(std::span<const std::size_t> byte_sizes, std::size_t cap_bytes);

template <class T>
concept GradientElement =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

struct GradientAveragerOptions {
  // DistributedDataParallel's default bucket_cap_mb = 25.
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
  Group group{};
};

// What DistributedDataParallel (ignite's auto_model) does to gradients after backward():
// every buffer ends as its average over the group's ranks. Rather than one all_reduce per
// parameter, as the tutorial's average_gradients does, consecutive buffers are packed into
// flat buckets of at most bucket_cap_bytes and each bucket costs one all_reduce, so a model of
// a thousand small tensors pays a handful of latencies instead of a thousand. Buckets are
// reduced asynchronously: bucket k is on the wire while bucket k+1 is packed, and unpacked
// while later ones still are. A bucket of one buffer is reduced in place, without a copy.
//
// Every rank of the group passes buffers of the same sizes in the same order, not
// overlapping one another. Ranks outside the group get their buffers back unchanged. Half
// precision buffers are summed in float by the backends and rounded once, then divided.
// Buffers are host memory, with every backend: buckets are packed and divided on the CPU,
// so device pointers (which nccl's collectives accept) are not supported here.
class IDIST_API GradientAverager {
 public:
  explicit GradientAverager(GradientAveragerOptions options = {});

  template <GradientElement T>
  void average(std::span<const std::span<T>> grads) {
    std::vector<RawBuffer> raw;
    raw.reserve(grads.size());
    for (const auto& g : grads) raw.push_back({g.data(), g.size()});
    average_raw(raw, dtype_of<T>);
  }
  template <GradientElement T>
  void average(const std::vector<std::span<T>>& grads) {
    average(std::span<const std::span<T>>(grads));
  }

  // The number of all_reduce calls the last average() made (0 outside the group).
  std::size_t last_collective_count() const { return last_collective_count_; }
  // The buckets of the last average().
  const std::vector<Bucket>& last_buckets() const { return last_buckets_; }
  const GradientAveragerOptions& options() const { return options_; }

 private:
  struct RawBuffer {
    void* data;
    std::size_t count;
  };
  void average_raw(std::span<const RawBuffer> buffers, DType dtype);

  GradientAveragerOptions options_;
  std::vector<std::byte> staging_;  // kept between calls: the same sizes come every step
  std::vector<Bucket> last_buckets_;
  std::size_t last_collective_count_ = 0;
};

}  // namespace idist
